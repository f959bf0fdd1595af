//! The driver's status codes the emulator returns, with the names and messages
//! `cuGetErrorName` / `cuGetErrorString` give for them.

use std::ffi::CStr;

/// `CUresult`.
pub type CUresult = i32;

/// `text`, which ends in its only NUL, as a C string (checked when the table is built).
const fn c_str(text: &'static str) -> &'static CStr {
    match CStr::from_bytes_with_nul(text.as_bytes()) {
        Ok(c) => c,
        Err(_) => panic!("a status's name or message holds a NUL"),
    }
}

/// Defines each status once: its constant, and its (code, name, message) row of [`TABLE`].
macro_rules! statuses {
    ($($konst:ident = $code:literal, $name:literal, $message:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "` = ", stringify!($code), ": \"", $message, "\"")]
            pub const $konst: CUresult = $code;
        )*

        /// (code, name, message) of every status the emulator can return or be told to inject.
        const TABLE: &[(CUresult, &CStr, &CStr)] =
            &[$(($code, c_str(concat!($name, "\0")), c_str(concat!($message, "\0")))),*];
    };
}

statuses! {
    SUCCESS = 0, "CUDA_SUCCESS", "no error";
    INVALID_VALUE = 1, "CUDA_ERROR_INVALID_VALUE", "invalid argument";
    OUT_OF_MEMORY = 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory";
    NOT_INITIALIZED = 3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error";
    DEINITIALIZED = 4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down";
    STUB_LIBRARY = 34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library";
    DEVICE_UNAVAILABLE = 46, "CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA-capable device(s) is/are busy or unavailable";
    NO_DEVICE = 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected";
    INVALID_DEVICE = 101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal";
    INVALID_IMAGE = 200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid";
    INVALID_CONTEXT = 201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context";
    NO_BINARY_FOR_GPU = 209, "CUDA_ERROR_NO_BINARY_FOR_GPU", "no kernel image is available for execution on the device";
    ECC_UNCORRECTABLE = 214, "CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ECC error encountered";
    UNSUPPORTED_PTX_VERSION = 222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "the provided PTX was compiled with an unsupported toolchain.";
    INVALID_HANDLE = 400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle";
    ILLEGAL_STATE = 401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state";
    NOT_FOUND = 500, "CUDA_ERROR_NOT_FOUND", "named symbol not found";
    NOT_READY = 600, "CUDA_ERROR_NOT_READY", "device not ready";
    ILLEGAL_ADDRESS = 700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered";
    LAUNCH_OUT_OF_RESOURCES = 701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch";
    CONTEXT_IS_DESTROYED = 709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed";
    HOST_MEMORY_ALREADY_REGISTERED = 712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped";
    HOST_MEMORY_NOT_REGISTERED = 713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region";
    LAUNCH_FAILED = 719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure";
    NOT_PERMITTED = 800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted";
    NOT_SUPPORTED = 801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported";
    UNKNOWN = 999, "CUDA_ERROR_UNKNOWN", "unknown error";
}

/// The `CUDA_ERROR_*` name of `code`.
pub fn name(code: CUresult) -> Option<&'static CStr> {
    TABLE.iter().find(|t| t.0 == code).map(|t| t.1)
}

/// The message of `code`.
pub fn message(code: CUresult) -> Option<&'static CStr> {
    TABLE.iter().find(|t| t.0 == code).map(|t| t.2)
}

/// A status from its name (`CUDA_ERROR_OUT_OF_MEMORY`, or without the prefix) or its number.
pub fn parse(s: &str) -> Option<CUresult> {
    if let Ok(n) = s.parse::<CUresult>() {
        return name(n).map(|_| n);
    }
    let full = if s.starts_with("CUDA_") {
        s.to_string()
    } else {
        format!("CUDA_ERROR_{s}")
    };
    TABLE
        .iter()
        .find(|t| t.1.to_str() == Ok(full.as_str()))
        .map(|t| t.0)
}

/// How far a status spreads once it happened (a real GPU's "sticky" errors).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stickiness {
    /// Only the call that returned it failed.
    Call,
    /// The context is unusable: every later call in it returns the same status.
    Context,
    /// The whole device is unusable (an uncorrectable ECC error).
    Device,
}

/// `ILLEGAL_ADDRESS` and `LAUNCH_FAILED` are the statuses NVIDIA documents as leaving "the
/// process in an inconsistent state". `LAUNCH_OUT_OF_RESOURCES` is a launch that "did not
/// occur", and `DEVICE_UNAVAILABLE` a device busy at context creation (compute mode): both
/// fail only their call (docs/cuda.md, rows 10 and 12).
pub fn stickiness(code: CUresult) -> Stickiness {
    match code {
        ILLEGAL_ADDRESS | LAUNCH_FAILED => Stickiness::Context,
        ECC_UNCORRECTABLE => Stickiness::Device,
        _ => Stickiness::Call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_parse_by_name_short_name_and_number() {
        assert_eq!(parse("CUDA_ERROR_OUT_OF_MEMORY"), Some(OUT_OF_MEMORY));
        assert_eq!(parse("ILLEGAL_ADDRESS"), Some(ILLEGAL_ADDRESS));
        assert_eq!(parse("719"), Some(LAUNCH_FAILED));
        assert_eq!(parse("NO_SUCH_ERROR"), None);
        assert_eq!(parse("12345"), None);
        assert_eq!(name(OUT_OF_MEMORY), Some(c"CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(message(NOT_READY), Some(c"device not ready"));
        assert_eq!(name(12345), None);
        assert_eq!(stickiness(ILLEGAL_ADDRESS), Stickiness::Context);
        assert_eq!(stickiness(ECC_UNCORRECTABLE), Stickiness::Device);
        assert_eq!(stickiness(OUT_OF_MEMORY), Stickiness::Call);
        assert_eq!(stickiness(LAUNCH_OUT_OF_RESOURCES), Stickiness::Call);
        assert_eq!(stickiness(DEVICE_UNAVAILABLE), Stickiness::Call);
    }
}
