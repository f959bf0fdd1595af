//! `nvjpegStatus_t`.

pub(crate) type Status = i32;

pub(crate) const SUCCESS: Status = 0;
pub(crate) const NOT_INITIALIZED: Status = 1;
pub(crate) const INVALID_PARAMETER: Status = 2;
pub(crate) const BAD_JPEG: Status = 3;
pub(crate) const JPEG_NOT_SUPPORTED: Status = 4;
pub(crate) const EXECUTION_FAILED: Status = 6;
pub(crate) const ARCH_MISMATCH: Status = 7;
pub(crate) const INTERNAL_ERROR: Status = 8;
pub(crate) const IMPLEMENTATION_NOT_SUPPORTED: Status = 9;
