//! `stoker bench --backend cuda --decode-only --decode-streams 1,2,4,2x2`: the hardware JPEG
//! engines' rate with several threads and batches in flight, on whole images and on the crops'
//! regions, beside how busy NVML says the engines were and what the decoding cost the CPU.
//!
//! # Design
//! - Each configuration `TxS` runs T threads, each with its own stream, nvJPEG decoder and S
//!   hardware batch states used in turn (the daemon's workers run 2 x 2): a state waits only
//!   for its own last decode before it decodes again, so S batches per thread are in flight.
//!   The threads take batches from one counter until every image was decoded once and
//!   `--min-seconds` have passed; the streams are synchronised once at the end.
//! - Regions are the ones the serving path decodes for the spec's crops (sample index, seed,
//!   epoch 0; `crop_region`), where the engines take them.
//! - The engines' utilisation is sampled every 100 ms while a row runs: NVML's
//!   `nvmlDeviceGetJpgUtilization` (loaded at run time), else the `jpg` column of
//!   `nvidia-smi dmon -s u`, else "n/a" (the emulated GPU has neither).
//! - CPU seconds are this process's (user + system) over the row, per 1000 images, and that
//!   divided by T (per thread).
//!
//! # Limitations
//! - Outputs are the images' own buffers, shared by the threads: two batches of the same
//!   images in flight at once write the same pixels (never read; only the rate counts).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use stoker_nvidia::cuda::{Device, DeviceBuffer};
use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegLib, Roi};
use stoker_pipeline::sync::lock;

/// One decode-only configuration: threads, and batches in flight per thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct DecodeStreams {
    pub threads: usize,
    pub states: usize,
}

impl std::str::FromStr for DecodeStreams {
    type Err = String;

    /// `T` (T threads, one batch in flight each) or `TxS`.
    fn from_str(s: &str) -> Result<DecodeStreams, String> {
        let (t, st) = s.split_once('x').unwrap_or((s, "1"));
        let n = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| (1..=64).contains(&n))
        };
        match (n(t), n(st)) {
            (Some(threads), Some(states)) => Ok(DecodeStreams { threads, states }),
            _ => Err(format!(
                "decode streams {s:?}: expected T or TxS with each between 1 and 64 (threads x \
                 batches in flight per thread), e.g. 2x2"
            )),
        }
    }
}

impl std::fmt::Display for DecodeStreams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.threads, self.states)
    }
}

/// One image the engines take: its bytes (where they live), region and output buffer.
#[derive(Clone, Copy)]
pub(super) struct EngineImage<'a> {
    pub jpeg: &'a [u8],
    pub roi: Option<Roi>,
    pub width: u32,
    pub out: &'a DeviceBuffer,
}

/// One measured configuration.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StreamsRow {
    pub streams: DecodeStreams,
    /// Regions of the crops (else whole images).
    pub roi: bool,
    pub images: u64,
    pub seconds: f64,
    pub images_per_s: f64,
    pub cpu_s_per_1000: f64,
    pub cpu_s_per_1000_per_thread: f64,
    /// Mean utilisation of the NVJPG engines while the row ran, in percent.
    pub jpg_util_percent: Option<f64>,
    /// Where the utilisation came from: "nvml", "nvidia-smi dmon" or "n/a".
    pub jpg_util_source: &'static str,
}

/// The rows as a table (nothing without rows).
pub(super) fn table(rows: &[StreamsRow]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n{:<44} {:>10} {:>9} {:>12} {:>12}\n",
        "decode only: threads x batches in flight",
        "images/s",
        "NVJPG %",
        "CPU s/1000",
        "per thread"
    );
    for r in rows {
        let what = if r.roi { "regions" } else { "whole images" };
        let util = r
            .jpg_util_percent
            .map_or_else(|| "n/a".to_string(), |u| format!("{u:.0}"));
        s += &format!(
            "{:<44} {:>10.1} {:>9} {:>12.3} {:>12.3}\n",
            format!("{}, {what}", r.streams),
            r.images_per_s,
            util,
            r.cpu_s_per_1000,
            r.cpu_s_per_1000_per_thread
        );
    }
    s
}

/// Decodes `images` with `cfg` until each was decoded once and `min_seconds` passed.
// String error: one message for the user, composed at the CLI edge.
pub(super) fn time_streams(
    device: &Device,
    lib: &Arc<NvjpegLib>,
    images: &[EngineImage<'_>],
    cfg: DecodeStreams,
    (batch, min_seconds): (usize, f64),
) -> Result<StreamsRow, String> {
    let batch = batch.max(1);
    let chunks: Vec<&[EngineImage<'_>]> = images.chunks(batch).collect();
    let next = AtomicUsize::new(0);
    let (count, failed) = (AtomicU64::new(0), Mutex::new(None::<String>));
    let meter = JpgMeter::start(&device.info().uuid.to_string());
    let (cpu0, t0) = (crate::bench::process_cpu_seconds(), Instant::now());
    std::thread::scope(|s| {
        for _ in 0..cfg.threads {
            s.spawn(|| {
                let r = decode_thread(
                    device,
                    lib,
                    &chunks,
                    cfg.states,
                    batch,
                    &next,
                    t0,
                    min_seconds,
                    &count,
                );
                if let Err(e) = r {
                    lock(&failed).get_or_insert(e);
                }
            });
        }
    });
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = crate::bench::process_cpu_seconds() - cpu0;
    let (util, source) = meter.stop();
    if let Some(e) = failed
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        return Err(e);
    }
    let n = count.into_inner();
    let per_1000 = cpu / n.max(1) as f64 * 1000.0;
    Ok(StreamsRow {
        streams: cfg,
        roi: images.iter().any(|i| i.roi.is_some()),
        images: n,
        seconds,
        images_per_s: n as f64 / seconds.max(1e-9),
        cpu_s_per_1000: per_1000,
        cpu_s_per_1000_per_thread: per_1000 / cfg.threads as f64,
        jpg_util_percent: util,
        jpg_util_source: source,
    })
}

/// One thread of a row: its stream, decoder and `states` batch states, taking chunks in turn.
#[allow(clippy::too_many_arguments)]
fn decode_thread(
    device: &Device,
    lib: &Arc<NvjpegLib>,
    chunks: &[&[EngineImage<'_>]],
    states: usize,
    batch: usize,
    next: &AtomicUsize,
    t0: Instant,
    min_seconds: f64,
    count: &AtomicU64,
) -> Result<(), String> {
    device.bind().map_err(|e| e.to_string())?;
    let stream = device.stream().map_err(|e| e.to_string())?;
    let mut decoder = NvjpegDecoder::new(device, lib.clone(), batch).map_err(|e| e.to_string())?;
    let mut states: Vec<_> = (0..states)
        .map(|_| decoder.hardware_batch_state())
        .collect::<Result<Option<Vec<_>>, _>>()
        .map_err(|e| e.to_string())?
        .ok_or("this GPU has no hardware JPEG decoder")?;
    let mut turn = 0usize;
    let r = loop {
        let k = next.fetch_add(1, Relaxed);
        if k >= chunks.len() && t0.elapsed().as_secs_f64() >= min_seconds {
            break Ok(());
        }
        let chunk = chunks[k % chunks.len()];
        let jpegs: Vec<&[u8]> = chunk.iter().map(|i| i.jpeg).collect();
        let rois: Vec<Option<Roi>> = chunk.iter().map(|i| i.roi).collect();
        let outs: Vec<DeviceImage> = chunk
            .iter()
            .map(|i| DeviceImage {
                ptr: i.out.ptr(),
                pitch: i.roi.map_or(i.width, |r| r.width) as usize * 3,
            })
            .collect();
        let n = states.len();
        let state = &mut states[turn % n];
        turn += 1;
        // SAFETY: each output is its image's buffer, sized for the whole image (a region is
        // smaller), alive until this function's synchronisation below; the bitstreams are
        // borrowed for the whole run and never change; the caller kept only images the
        // engines accepted with these regions.
        let r = unsafe { decoder.decode_hardware_batch_in(state, &stream, &jpegs, &rois, &outs) };
        if let Err(e) = r {
            break Err(format!("nvJPEG: {e}"));
        }
        count.fetch_add(chunk.len() as u64, Relaxed);
    };
    // Work already enqueued must not outlive the buffers.
    let synced = stream.synchronize().map_err(|e| e.to_string());
    r.and(synced)
}

/// Samples the NVJPG engines' utilisation on a thread while a row runs.
struct JpgMeter {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Option<f64>, &'static str)>>,
}

impl JpgMeter {
    fn start(uuid: &str) -> JpgMeter {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, uuid) = (stop.clone(), uuid.to_string());
        let thread = std::thread::spawn(move || match stoker_nvidia::nvml::Nvml::open(&uuid) {
            Ok(nvml) if nvml.jpg_utilization().is_some() => {
                let mut samples = Vec::new();
                while !flag.load(Relaxed) {
                    samples.extend(nvml.jpg_utilization().map(f64::from));
                    std::thread::sleep(Duration::from_millis(100));
                }
                (mean(&samples), "nvml")
            }
            _ => dmon(&uuid, &flag),
        });
        JpgMeter {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) -> (Option<f64>, &'static str) {
        self.stop.store(true, Relaxed);
        let joined = self.thread.take().map(std::thread::JoinHandle::join);
        match joined {
            Some(Ok(r)) => r,
            _ => (None, "n/a"),
        }
    }
}

fn mean(samples: &[f64]) -> Option<f64> {
    (!samples.is_empty()).then(|| samples.iter().sum::<f64>() / samples.len() as f64)
}

/// `nvidia-smi dmon -s u` on the GPU until `stop`: the mean of its `jpg` column.
fn dmon(uuid: &str, stop: &AtomicBool) -> (Option<f64>, &'static str) {
    use std::io::Read;
    let child = std::process::Command::new("nvidia-smi")
        .args(["dmon", "-s", "u", "-d", "1", "-i", uuid])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return (None, "n/a");
    };
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    let _ = child.wait();
    match mean(&dmon_jpg(&text)) {
        Some(m) => (Some(m), "nvidia-smi dmon"),
        None => (None, "n/a"),
    }
}

/// The `jpg` column's values in `nvidia-smi dmon -s u` output (a header line `# gpu sm mem
/// enc dec jpg ofa`, a units line, then one line per sample); none without that column.
pub(crate) fn dmon_jpg(text: &str) -> Vec<f64> {
    let mut column = None;
    let mut out = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.trim_start_matches('#').split_whitespace().collect();
        if line.starts_with('#') {
            if let Some(at) = fields.iter().position(|f| *f == "jpg") {
                column = Some(at);
            }
            continue;
        }
        if let Some(v) = column
            .and_then(|c| fields.get(c))
            .and_then(|v| v.parse().ok())
        {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_streams_are_threads_or_threads_by_states() {
        let p = |s: &str| s.parse::<DecodeStreams>();
        assert_eq!(
            p("4"),
            Ok(DecodeStreams {
                threads: 4,
                states: 1
            })
        );
        assert_eq!(
            p("2x2"),
            Ok(DecodeStreams {
                threads: 2,
                states: 2
            })
        );
        let err = p("0").unwrap_err();
        assert!(err.contains("\"0\"") && err.contains("TxS"), "{err}");
        assert!(p("2x").is_err() && p("x2").is_err() && p("many").is_err());
    }

    #[test]
    fn the_jpg_column_of_nvidia_smi_dmon_is_read_by_its_header() {
        let text = "# gpu     sm    mem    enc    dec    jpg    ofa \n\
                    # Idx      %      %      %      %      %      % \n\
                    \x20   0      3      1      0      0     57      0 \n\
                    \x20   0      4      1      0      0     63      - \n";
        assert_eq!(dmon_jpg(text), vec![57.0, 63.0]);
        // A driver whose dmon has no jpg column: nothing.
        let old = "# gpu     sm    mem    enc    dec\n# Idx      %      %      %      %\n    0  1  1  0  0\n";
        assert!(dmon_jpg(old).is_empty());
    }
}
