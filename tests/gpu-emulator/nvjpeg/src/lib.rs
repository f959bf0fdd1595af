//! An emulated nvJPEG: a stand-in for libnvjpeg that stoker's real binding loads through
//! `STOKER_NVJPEG`, on the emulated GPU (tests/gpu-emulator/cuda). Real libnvjpeg cannot run on
//! a substitute driver (it reaches libcuda through undocumented export tables), so nvJPEG
//! needs its own stand-in.
//!
//! Every call refuses (`NVJPEG_STATUS_NOT_INITIALIZED`) unless `STOKER_GPU_EMULATOR=1`.
//!
//! # Design
//! - [`header`]: nvJPEG's rules for which decoder takes which JPEG (the hardware engines:
//!   baseline Huffman 8-bit 4:4:4 / 4:2:2 / 4:2:0 / 4:4:0 / gray; the GPU-hybrid decoder:
//!   also extended and progressive, any sampling; neither: arithmetic, lossless, 12-bit,
//!   CMYK). `nvjpegDecodeBatchedSupportedEx` reports **0 for supported**, as nvJPEG does.
//! - [`decode`]: libjpeg-turbo decodes; ROI and output formats (Y, RGB, BGR, RGBI, BGRI).
//! - [`cuda`]: the output is written on the caller's CUDA stream of the emulated driver
//!   (`cuLaunchHostFunc`); engines and cores per device come from the emulator's
//!   configuration (`nvjpegGetHardwareDecoderInfo`).
//! - [`version`]: its major (from the soname it was loaded by, else 13), and handle creation
//!   refused on a driver of an older CUDA major.
//! - [`objects`]: handles checked in a registry; the path that decoded each image is recorded
//!   for tests (`stoker_emu_nvjpeg_path`).
//! - [`overlap`]: the most batched decodes pending on one stream at once, for tests
//!   (`$STOKER_EMU_STATS_DIR/<pid>.nvjpeg.json`).
//!
//! # Limitations
//! Only the calls stoker makes are exported. `NVJPEG_OUTPUT_UNCHANGED` / `YUV` are
//! `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED`. Chroma upsampling is libjpeg-turbo's, not
//! the hardware's (decoders are compared by PSNR). Allocators passed to `nvjpegCreateEx` and
//! buffers are accepted and not used. Nothing about speed can be learned.

// The emulated GPU mirrors the C types of the NVIDIA APIs (int sizes, u64 handles, signed
// strides) in test-only code; its tests check its arithmetic, not a conversion per cast (the
// workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
// C ABI entry points taking nvJPEG's raw pointers (see ../cuda/src/lib.rs).
#![allow(clippy::not_unsafe_ptr_arg_deref)]

// The C ABI is the surface: the two modules of exported calls are public so that their
// `#[no_mangle]` entry points are reachable items (no crate names them by path; libraries are
// loaded by symbol); everything else is internal.
pub mod api;
mod cuda;
mod decode;
pub mod decode_api;
mod header;
mod objects;
mod overlap;
mod status;
mod version;
