//! What the emulated machine looks like: its devices, the delay of every stream operation,
//! and the faults to inject. Read once, at `cuInit`.
//!
//! # Design
//! - `STOKER_EMU_CONFIG`: JSON, inline (starts with `{`) or the path of a file:
//!   `{"devices": [{"uuid": "GPU-...", "name": "...", "compute_capability": [9, 0],
//!   "memory_mib": 4096, "jpeg_engines": 7, "jpeg_cores_per_engine": 1, "vmm": true,
//!   "posix_fd": true, "compute_mode": "default"}],
//!   "op_delay_us": 0, "driver_version": 13000, "faults": [{"call": "cuMemAlloc_v2", "nth": 2,
//!   "error": "CUDA_ERROR_OUT_OF_MEMORY"}]}`. Every field has a default; unknown fields are
//!   errors.
//! - `driver_version` is what `cuDriverGetVersion` reports (1000 * major + 10 * minor: 12080
//!   stands for an R570 driver, 13000 for R580): the newest CUDA the driver runs. A cubin,
//!   PTX or nvJPEG of a newer CUDA major is refused (docs/cuda.md, rows 3 and 50).
//! - Without it: two devices ([`default_devices`]).
//! - `STOKER_EMU_OP_DELAY_US` overrides `op_delay_us`; `STOKER_EMU_FAULTS`
//!   (`call:nth:ERROR[,call:nth:ERROR...]`) adds faults.
//! - `CUDA_VISIBLE_DEVICES` (ordinals or UUIDs, comma-separated) picks and orders the visible
//!   devices as the real driver does.
//!
//! # Limitations
//! MIG UUIDs in `CUDA_VISIBLE_DEVICES` are not understood (an error naming the entry).

use serde::Deserialize;

/// Mebibytes of memory of a default device.
pub(crate) const DEFAULT_MEMORY_MIB: u64 = 4096;

/// One emulated GPU.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeviceConfig {
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub(crate) uuid: String,
    #[serde(default = "default_name")]
    pub(crate) name: String,
    #[serde(default = "default_cc")]
    pub(crate) compute_capability: [u32; 2],
    #[serde(default = "default_memory")]
    pub(crate) memory_mib: u64,
    /// Hardware JPEG engines (`nvjpegGetHardwareDecoderInfo`); 0: no hardware decoder.
    #[serde(default = "default_engines")]
    pub(crate) jpeg_engines: u32,
    #[serde(default = "default_cores")]
    pub(crate) jpeg_cores_per_engine: u32,
    /// `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`; without it `cuMemCreate` is
    /// `NOT_SUPPORTED`.
    #[serde(default = "default_true")]
    pub(crate) vmm: bool,
    /// `CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED`; without it an
    /// allocation asking for POSIX-fd handles is `NOT_SUPPORTED`.
    #[serde(default = "default_true")]
    pub(crate) posix_fd: bool,
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_MODE`.
    #[serde(default)]
    pub(crate) compute_mode: ComputeMode,
}

/// A device's compute mode (`CUcomputemode`), as `nvidia-smi -c` sets it.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ComputeMode {
    /// `CU_COMPUTEMODE_DEFAULT`: any number of contexts.
    #[default]
    Default,
    /// `CU_COMPUTEMODE_PROHIBITED`: no context can be made on it;
    /// `cuDevicePrimaryCtxRetain` is `CUDA_ERROR_DEVICE_UNAVAILABLE` ("Devices are often
    /// unavailable due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or CU_COMPUTEMODE_PROHIBITED").
    Prohibited,
}

impl ComputeMode {
    /// The `CUcomputemode` value.
    pub(crate) fn value(self) -> i32 {
        match self {
            ComputeMode::Default => 0,
            ComputeMode::Prohibited => 2,
        }
    }
}

fn default_true() -> bool {
    true
}

fn default_name() -> String {
    "Stoker Emulated GPU".into()
}
fn default_cc() -> [u32; 2] {
    [9, 0]
}
fn default_memory() -> u64 {
    DEFAULT_MEMORY_MIB
}
fn default_engines() -> u32 {
    7
}
fn default_cores() -> u32 {
    1
}

/// Make the `nth` call (1-based, counted per process) of `call` return `error`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct FaultConfig {
    pub(crate) call: String,
    pub(crate) nth: u64,
    pub(crate) error: String,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub(crate) struct EmuConfig {
    #[serde(default = "default_devices")]
    pub(crate) devices: Vec<DeviceConfig>,
    #[serde(default)]
    pub(crate) op_delay_us: u64,
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor.
    #[serde(default = "default_driver_version")]
    pub(crate) driver_version: i32,
    #[serde(default)]
    pub(crate) faults: Vec<FaultConfig>,
}

/// The driver version reported by default: CUDA 13.0 (an R580 driver).
pub(crate) const DEFAULT_DRIVER_VERSION: i32 = 13000;

fn default_driver_version() -> i32 {
    DEFAULT_DRIVER_VERSION
}

/// Two Hopper-like devices, so multi-GPU paths run by default.
pub(crate) fn default_devices() -> Vec<DeviceConfig> {
    (0..2)
        .map(|i| DeviceConfig {
            uuid: format!("GPU-57e0e3c0-0000-4000-8000-00000000000{i}"),
            name: format!("Stoker Emulated GPU {i}"),
            compute_capability: default_cc(),
            memory_mib: DEFAULT_MEMORY_MIB,
            jpeg_engines: default_engines(),
            jpeg_cores_per_engine: default_cores(),
            vmm: true,
            posix_fd: true,
            compute_mode: ComputeMode::Default,
        })
        .collect()
}

/// A device as this process sees it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Device {
    pub(crate) uuid: [u8; 16],
    pub(crate) config: DeviceConfig,
}

/// A fault to inject: the `nth` call (from 1) of the exported symbol `call` fails with
/// `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PlannedFault {
    pub(crate) call: String,
    pub(crate) nth: u64,
    pub(crate) status: i32,
}

/// The machine after reading every source.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Machine {
    /// Visible devices, in ordinal order.
    pub(crate) devices: Vec<Device>,
    pub(crate) op_delay_us: u64,
    /// `cuDriverGetVersion`: the newest CUDA this driver runs.
    pub(crate) driver_version: i32,
    pub(crate) faults: Vec<PlannedFault>,
}

/// Parses `GPU-` + 8-4-4-4-12 hex digits.
pub(crate) fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let rest = s.strip_prefix("GPU-")?;
    let groups: Vec<usize> = rest.split('-').map(str::len).collect();
    if groups != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = rest.split('-').collect();
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Formats a UUID as nvidia-smi does.
pub(crate) fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Reads the configuration from the environment. The error names the input and the reason.
pub(crate) fn load() -> Result<Machine, String> {
    let config: EmuConfig = match env("STOKER_EMU_CONFIG") {
        None => EmuConfig {
            devices: default_devices(),
            op_delay_us: 0,
            driver_version: DEFAULT_DRIVER_VERSION,
            faults: Vec::new(),
        },
        Some(v) if v.trim_start().starts_with('{') => {
            serde_json::from_str(&v).map_err(|e| format!("STOKER_EMU_CONFIG (inline JSON): {e}"))?
        }
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("STOKER_EMU_CONFIG file {path}: {e}"))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("STOKER_EMU_CONFIG file {path}: {e}"))?
        }
    };
    let delay = match env("STOKER_EMU_OP_DELAY_US") {
        Some(v) => v
            .trim()
            .parse()
            .map_err(|e| format!("STOKER_EMU_OP_DELAY_US={v:?}: {e}"))?,
        None => config.op_delay_us,
    };
    let mut faults = Vec::new();
    for f in &config.faults {
        faults.push(fault(&f.call, f.nth, &f.error, "STOKER_EMU_CONFIG")?);
    }
    if let Some(list) = env("STOKER_EMU_FAULTS") {
        for item in list.split(',').filter(|s| !s.trim().is_empty()) {
            let parts: Vec<&str> = item.trim().split(':').collect();
            let [call, nth, error] = parts[..] else {
                return Err(format!(
                    "STOKER_EMU_FAULTS entry {item:?}: expected call:nth:ERROR"
                ));
            };
            let nth = nth
                .parse()
                .map_err(|e| format!("STOKER_EMU_FAULTS entry {item:?}: nth: {e}"))?;
            faults.push(fault(call, nth, error, "STOKER_EMU_FAULTS")?);
        }
    }
    // CUDA 11.0 (11000) to 99.x: what cuDriverGetVersion can report for a driver stoker meets.
    if !(11000..100_000).contains(&config.driver_version) || config.driver_version % 10 != 0 {
        return Err(format!(
            "STOKER_EMU_CONFIG driver_version {}: not 1000 * major + 10 * minor for CUDA 11 or newer",
            config.driver_version
        ));
    }
    let all = physical_devices(&config.devices)?;
    let devices = visible(all, env("CUDA_VISIBLE_DEVICES").as_deref())?;
    Ok(Machine {
        devices,
        op_delay_us: delay,
        driver_version: config.driver_version,
        faults,
    })
}

fn fault(call: &str, nth: u64, error: &str, source: &str) -> Result<PlannedFault, String> {
    if nth == 0 {
        return Err(format!("{source}: fault on {call}: nth counts from 1"));
    }
    let code = crate::status::parse(error)
        .ok_or_else(|| format!("{source}: fault on {call}: unknown error {error:?}"))?;
    Ok(PlannedFault {
        call: call.to_string(),
        nth,
        status: code,
    })
}

fn physical_devices(devices: &[DeviceConfig]) -> Result<Vec<Device>, String> {
    let mut out: Vec<Device> = Vec::new();
    for d in devices {
        let uuid = parse_uuid(&d.uuid).ok_or_else(|| {
            format!(
                "STOKER_EMU_CONFIG device {:?}: not a GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx UUID",
                d.uuid
            )
        })?;
        if out.iter().any(|o| o.uuid == uuid) {
            return Err(format!(
                "STOKER_EMU_CONFIG device {}: UUID listed twice",
                d.uuid
            ));
        }
        let [major, minor] = d.compute_capability;
        if !(5..=12).contains(&major) || minor > 9 {
            return Err(format!(
                "STOKER_EMU_CONFIG device {}: compute capability {major}.{minor} is not one a GPU has",
                d.uuid
            ));
        }
        if d.memory_mib == 0 {
            return Err(format!(
                "STOKER_EMU_CONFIG device {}: memory_mib is 0",
                d.uuid
            ));
        }
        out.push(Device {
            uuid,
            config: d.clone(),
        });
    }
    Ok(out)
}

/// Applies `CUDA_VISIBLE_DEVICES`: ordinals or UUIDs; the list stops at the first invalid
/// ordinal, as the real driver's does, but an entry that is neither is an error here.
fn visible(all: Vec<Device>, cvd: Option<&str>) -> Result<Vec<Device>, String> {
    let Some(cvd) = cvd else { return Ok(all) };
    let mut out: Vec<Device> = Vec::new();
    for item in cvd.split(',').map(str::trim) {
        let found = if let Ok(i) = item.parse::<usize>() {
            all.get(i)
        } else if let Some(u) = parse_uuid(item) {
            all.iter().find(|d| d.uuid == u)
        } else {
            return Err(format!(
                "CUDA_VISIBLE_DEVICES entry {item:?}: neither an ordinal nor a GPU- UUID"
            ));
        };
        match found {
            Some(d) if !out.contains(d) => out.push(d.clone()),
            _ => break,
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip() {
        let s = "GPU-57e0e3c0-0000-4000-8000-000000000001";
        assert_eq!(format_uuid(&parse_uuid(s).unwrap()), s);
        assert!(parse_uuid("MIG-57e0e3c0-0000-4000-8000-000000000001").is_none());
    }

    #[test]
    fn visible_devices_pick_and_reorder() {
        let all = physical_devices(&default_devices()).unwrap();
        let v = visible(all.clone(), Some("1,0")).unwrap();
        assert_eq!(v[0].uuid, all[1].uuid);
        let v = visible(all.clone(), Some(&all[1].config.uuid)).unwrap();
        assert_eq!(v.len(), 1);
        assert_eq!(visible(all.clone(), Some("0,7,1")).unwrap().len(), 1);
        assert!(visible(all, Some("banana")).is_err());
    }

    #[test]
    fn bad_devices_are_named() {
        let mut d = default_devices();
        d[1].uuid = d[0].uuid.clone();
        assert!(physical_devices(&d).unwrap_err().contains("twice"));
        d[1].uuid = "GPU-1".into();
        assert!(physical_devices(&d).unwrap_err().contains("GPU-1"));
    }
}
