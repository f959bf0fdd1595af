//! Which backend a decoder's library handle is made with: the hardware one where the GPU has
//! JPEG engines, else the default one.
//!
//! # Design
//! - `nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)` failing with `NVJPEG_STATUS_ARCH_MISMATCH` is
//!   "no hardware decoder on this GPU": the default backend then serves, as torchvision does
//!   (`torchvision/csrc/io/image/cuda/decode_jpegs_cuda.cpp` retries with
//!   `NVJPEG_BACKEND_DEFAULT` on exactly that status). Any other failure is nvJPEG failing,
//!   not a missing engine, and is the decoder's error: a GPU whose engines are there but whose
//!   library cannot start them should say so, not quietly decode on its cores.
//! - A hardware handle that reports 0 engines or 0 cores per engine
//!   (`nvjpegGetHardwareDecoderInfo`: "Return value of 0 indicates that hardware decoder is
//!   not available"; nvImageCodec's `hw_decoder.cpp` then sets its hardware load to 0) is no
//!   hardware decoder either: it is released and the default backend serves.

use std::sync::Arc;

use super::handles::LibHandle;
use super::{result, sys, NvjpegError, NvjpegLib, NvjpegStatus};

/// A decoder's library handle, and the hardware engines behind it: `Some((engines, cores
/// per engine))` for a hardware handle with both above 0, `None` for a default one.
pub(super) type Opened = (Arc<LibHandle>, Option<(u32, u32)>);

/// The library handle a decoder is made with (see the module's Design).
pub(super) fn open_handle(lib: &Arc<NvjpegLib>) -> Result<Opened, NvjpegError> {
    let no_hardware = |why: &dyn std::fmt::Display| {
        tracing::info!(reason = %why, "no hardware JPEG decoder; decoding on the GPU cores");
        Ok((LibHandle::create(lib.clone(), sys::BACKEND_DEFAULT)?, None))
    };
    let handle = match LibHandle::create(lib.clone(), sys::BACKEND_HARDWARE) {
        Ok(h) => h,
        Err(e) if is_arch_mismatch(&e) => return no_hardware(&e),
        Err(e) => return Err(e),
    };
    // SAFETY: the handle is live (held here) and made with the hardware backend.
    let (engines, cores) =
        unsafe { result::get_hardware_decoder_info(handle.sys(), handle.raw())? };
    if engines == 0 || cores == 0 {
        drop(handle);
        let why = format!("nvjpegGetHardwareDecoderInfo reports {engines} engines x {cores} cores");
        return no_hardware(&why);
    }
    Ok((handle, Some((engines, cores))))
}

/// Whether `e` is `nvjpegCreateEx` saying the GPU has no hardware decoder.
fn is_arch_mismatch(e: &NvjpegError) -> bool {
    matches!(e, NvjpegError::Call { status, .. } if *status == NvjpegStatus::ARCH_MISMATCH)
}
