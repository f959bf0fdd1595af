//! The daemon's answer to a status request ([`Message::Status`](super::Message::Status)):
//! what it serves now, per GPU, job and rank.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
/// Daemon → client, the answer to [`Message::Status`]: what the daemon serves now. JSON,
/// bounded by [`MAX_MESSAGE_BYTES`](super::MAX_MESSAGE_BYTES) (the daemon leaves out jobs that do not fit and says so
/// in `jobs_left_out`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonStatus {
    /// The daemon's [`VERSION`](super::VERSION).
    pub daemon_version: String,
    /// The daemon's [`PROTOCOL_VERSION`](super::PROTOCOL_VERSION).
    pub protocol: u16,
    /// The daemon's process id.
    pub pid: u32,
    /// Seconds since the daemon started.
    pub uptime_s: f64,
    /// The socket the daemon serves on.
    pub socket: String,
    /// Whether the socket came from systemd (socket activation).
    pub activated: bool,
    /// True once SIGTERM started the drain.
    pub stopping: bool,
    /// Attached ranks (all jobs).
    pub clients: u64,
    /// Decode backend in use (`cpu`, `cuda`).
    pub backend: String,
    /// Reader in use (`io_uring`, `pread`).
    pub reader: String,
    /// Decode worker threads.
    pub threads: u64,
    /// Images delivered to clients since start.
    pub images_delivered: u64,
    /// Delivered images per second over the last few seconds.
    pub images_per_s: f64,
    /// Samples that could not be read or decoded since start.
    pub bad_samples: u64,
    /// Ring memory mapped for clients (bytes, host).
    pub ring_bytes: u64,
    /// Datasets registered in the config, by name.
    pub datasets: Vec<String>,
    /// The jobs the asking user may see, as many as fit.
    pub jobs: Vec<JobStatus>,
    /// Jobs not listed because the reply would exceed the message size limit.
    pub jobs_left_out: u64,
    /// Each GPU the cuda backend serves from (one once a rank attached on it); left out when
    /// there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuStatus>,
    /// Each remote worker this home daemon sends units to (`[remote] workers`); left out
    /// when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workers: Vec<WorkerStatus>,
    /// The share of images (so of units) the remote workers filled since start; none
    /// without workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_share: Option<f64>,
}

/// One remote worker in a [`DaemonStatus`], as its home daemon saw it since start.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerStatus {
    /// The worker's address as configured (`host:port`).
    pub addr: String,
    /// Units sent to it and not answered yet.
    pub units_in_flight: u64,
    /// Units it answered in full.
    pub units_done: u64,
    /// Units given up on after a fault (timeout, cut or malformed answer) and filled locally.
    pub units_reissued: u64,
    /// Units the worker refused (filled locally).
    pub units_refused: u64,
    /// Images it filled.
    pub images: u64,
    /// Images it filled per second, recently.
    pub images_per_s: f64,
    /// Mean time from sending a unit to the last byte of its pixels.
    pub round_trip_ms: f64,
    /// TCP payload bytes sent to it and received from it (frames and pixels).
    pub bytes_sent: u64,
    /// TCP payload bytes received from it (frames and pixels).
    pub bytes_received: u64,
    /// CPU seconds the home daemon's connections spent reading its answers.
    pub receive_cpu_s: f64,
}

/// One GPU in a [`DaemonStatus`]: its health, decode mix, ring memory and time per batch.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuStatus {
    /// The GPU's UUID (`GPU-…`), as ATTACH names it.
    pub uuid: String,
    /// The product name the driver reports.
    pub name: String,
    /// The GPU is stoker's emulator (tests/gpu-emulator), not a real device.
    pub emulated: bool,
    /// Why the GPU stopped serving (its context broke), if it did.
    pub broken: Option<String>,
    /// Images decoded on the hardware JPEG engines.
    pub decoded_hardware: u64,
    /// Images decoded by nvJPEG's GPU-hybrid decoder.
    pub decoded_hybrid: u64,
    /// Images decoded on the CPU for this GPU's rings.
    pub decoded_cpu: u64,
    /// Batches filled on this GPU since start.
    pub batches: u64,
    /// Batches queued on the GPU and not finished yet.
    pub batches_in_flight: i64,
    /// Device memory of the rings on this GPU.
    pub ring_device_bytes: u64,
    /// Mean host time per batch in decode (nvJPEG calls and the CPU path).
    pub decode_ms_per_batch: f64,
    /// Mean device time per batch from the end of decode to the end of the kernel.
    pub kernel_ms_per_batch: f64,
}

/// One job in a [`DaemonStatus`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobStatus {
    /// The job's key, as its ranks' ATTACH named it.
    pub job: String,
    /// The uid that created the job: jobs are keyed by owner and key, so two users' jobs may
    /// share a key. A user's STATUS shows only their own jobs (root and the daemon's uid see
    /// every job).
    #[serde(default)]
    pub owner: u32,
    /// The dataset as ATTACH named it (a registered name or a path).
    pub dataset: String,
    /// Samples in the dataset.
    pub samples: u64,
    /// Ranks the job has.
    pub world_size: u32,
    /// Ranks attached now.
    pub ranks: Vec<u32>,
    /// Samples per batch, from the spec.
    pub batch_size: u32,
    /// Batches per epoch for each rank.
    pub steps_per_epoch: u64,
    /// Images delivered to this job's ranks.
    pub images_delivered: u64,
    /// The data stall of each attached rank that reported one (see [`Stats`]), by rank.
    #[serde(default)]
    pub stalls: Vec<RankStall>,
}

/// One rank's data stall in a [`JobStatus`].
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RankStall {
    /// The rank, `0..world_size`.
    pub rank: u32,
    /// Share of the training loop's time spent waiting for data, over the interval between
    /// the rank's last two reports (the whole attach after its first report).
    pub wait_fraction: f64,
    /// Seconds waited inside `next()` since the attach.
    pub wait_s: f64,
    /// Seconds spent between `next()` calls since the attach.
    pub compute_s: f64,
    /// Batches the rank received since the attach.
    pub batches: u64,
}
