//! `nvjpegStatus_t`.

pub type Status = i32;

pub const SUCCESS: Status = 0;
pub const NOT_INITIALIZED: Status = 1;
pub const INVALID_PARAMETER: Status = 2;
pub const BAD_JPEG: Status = 3;
pub const JPEG_NOT_SUPPORTED: Status = 4;
pub const EXECUTION_FAILED: Status = 6;
pub const ARCH_MISMATCH: Status = 7;
pub const INTERNAL_ERROR: Status = 8;
pub const IMPLEMENTATION_NOT_SUPPORTED: Status = 9;
