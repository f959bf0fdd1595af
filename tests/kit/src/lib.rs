//! The test kit: what the integration tests (`tests/`), the crates' own tests and the benchmarks
//! share (fixture builders, the real daemon, processes of another uid, the emulated GPU).
//!
//! - [`images`]: small real JPEG datasets in temp dirs ([`write_image_folder`]).
//! - [`daemon`]: the built `stokerd` ([`stokerd_path`]) and [`Daemon`], a real daemon on a
//!   temp socket, killed on drop; `libstoker.so` and the C test clients.
//! - [`attach`]: the specs and options tests attach with.
//! - [`batches`]: batches reduced to what identifies them ([`batches::Got`]), a config file.
//! - [`device_batches`]: device batches copied back and compared with the CPU backend's.
//! - [`emulator`]: the emulated GPU (tests/gpu-emulator) as the driver of this process.
//! - [`child`]: the test binary again in a role, processes of another uid.
//! - [`wire`]: the protocol spoken by hand.
//! - [`client_process`]: the client processes tests start (`stoker-test-client`).
//! - [`shards`]: WebDataset shard sets with captions and JSON fields.
//! - [`rank_orders`]: what a rank's client process does in the multi-host tests.
//! - [`prometheus`]: the daemon's metrics endpoint scraped over HTTP.
//! - [`edge_manifest`], [`fuzz_cases`]: the edge corpus's expectations, fuzz case counts.

// The test kit: its casts are of small sizes, counts and pixel values chosen by the tests, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

pub mod attach;
pub mod batches;
pub mod child;
pub mod client_process;
pub mod daemon;
pub mod device_batches;
pub mod edge_manifest;
pub mod emulator;
pub mod fuzz_cases;
pub mod images;
pub mod prometheus;
pub mod rank_orders;
pub mod shards;
pub mod wire;

pub use daemon::{
    manifest_config, proc_fd_targets, proc_rss_kib, read_log, repo_root, stokerd_path, Daemon,
};
pub use images::{
    encode_jpeg, synthetic_rgb, temp_image_folder, tiny_dataset, write_image_folder, write_jpeg,
};

/// DINO's local view at `side` pixels: RandomResizedCrop(scale 0.05-0.4, ratio 3/4-4/3) and a
/// flip at 0.5, no operations.
pub fn local_view(side: u32) -> stoker::spec::View {
    use stoker::spec::{Crop, View};
    let crop = Crop::RandomResized {
        size: [side, side],
        scale: [0.05, 0.4],
        ratio: [0.75, 4.0 / 3.0],
    };
    View::new(crop, 0.5)
}

/// FNV-1a over byte slices: a stable hash for comparing batches across runs and processes.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}
