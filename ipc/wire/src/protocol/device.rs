//! Which device a rank's batches go to, as a user names it and as ATTACH carries it.
//!
//! # Design
//! - A [`Device`] is parsed once from its name (`cpu`, `cuda` / `gpu`, `cuda:N`, a `GPU-`
//!   UUID) where the name enters: the Rust client's caller, the C ABI's `device` string, the
//!   tool's `--device`, and the daemon's protocol decoder for ATTACH's `device` field.
//!   Everything after that matches on the type.
//! - Its `Display` is the canonical spelling (`cpu`, `cuda:N`, `GPU-…`), which parses back to
//!   the same device: ATTACH's JSON is the device's `Display`, so the wire string is what it
//!   always was.
//! - An ordinal means something only in the process that numbered its devices (under its
//!   `CUDA_VISIBLE_DEVICES`): the client resolves it to the UUID before it attaches
//!   (`Device::resolve`), and the daemon refuses an ATTACH that carries one.

#![forbid(unsafe_code)]

use stoker_nvidia::cuda::GpuUuid;

/// A device as a user names it: `cpu`, `cuda` / `gpu` (ordinal 0), `cuda:N` (ordinal `N` under
/// this process's `CUDA_VISIBLE_DEVICES`) or a `GPU-` UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Device {
    /// Host memory: the images stay in the memfd ring.
    #[default]
    Cpu,
    /// A GPU: the images land in device memory on it.
    Cuda(CudaDevice),
}

/// Which GPU a [`Device::Cuda`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaDevice {
    /// An ordinal as this process numbers its visible devices.
    Ordinal(usize),
    /// A GPU by UUID, the same in every process.
    Uuid(GpuUuid),
}

/// A device name that is none of the known forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {0:?} is not \"cpu\", \"cuda\", \"cuda:N\" or a GPU UUID (GPU-xxxxxxxx-...)")]
pub struct UnknownDevice(
    /// The name given, trimmed.
    pub String,
);

impl std::str::FromStr for Device {
    type Err = UnknownDevice;

    /// Surrounding whitespace is ignored; anything else unknown is refused by name.
    fn from_str(name: &str) -> Result<Device, UnknownDevice> {
        let name = name.trim();
        let unknown = || UnknownDevice(name.into());
        Ok(match name {
            "cpu" => Device::Cpu,
            "cuda" | "gpu" => Device::Cuda(CudaDevice::Ordinal(0)),
            _ => Device::Cuda(match name.strip_prefix("cuda:") {
                Some(n) => CudaDevice::Ordinal(n.parse().map_err(|_| unknown())?),
                None => CudaDevice::Uuid(name.parse().map_err(|_| unknown())?),
            }),
        })
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(CudaDevice::Ordinal(n)) => write!(f, "cuda:{n}"),
            Device::Cuda(CudaDevice::Uuid(uuid)) => write!(f, "{uuid}"),
        }
    }
}

impl Device {
    /// The GPU's UUID when this device names one by UUID (`None` for `cpu` and ordinals).
    pub fn gpu_uuid(&self) -> Option<GpuUuid> {
        match *self {
            Device::Cuda(CudaDevice::Uuid(uuid)) => Some(uuid),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_once_and_print_back() {
        let cases = [
            (" cpu ", "cpu"),
            ("cuda", "cuda:0"),
            ("gpu", "cuda:0"),
            ("cuda:3", "cuda:3"),
        ];
        for (name, shown) in cases {
            let d: Device = name.parse().unwrap();
            assert_eq!(d.to_string(), shown, "{name}");
            assert_eq!(shown.parse::<Device>().unwrap(), d);
        }
        let u = "GPU-5E2F0D8A-1B2C-4D3E-8F90-A1B2C3D4E5F6";
        let d: Device = u.parse().unwrap();
        assert!(d.gpu_uuid().is_some());
        assert_eq!(d.to_string(), u.to_lowercase().replacen("gpu", "GPU", 1));
        assert_eq!(d.to_string().parse::<Device>().unwrap(), d);
        assert_eq!(Device::default(), Device::Cpu);
        assert_eq!("cuda:1".parse::<Device>().unwrap().gpu_uuid(), None);
    }

    #[test]
    fn unknown_names_are_refused_by_name() {
        for bad in [
            "tpu",
            "cuda:x",
            "cuda:-1",
            "",
            "MIG-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
        ] {
            let e = bad.parse::<Device>().unwrap_err();
            assert_eq!(e, UnknownDevice(bad.into()));
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }
}
