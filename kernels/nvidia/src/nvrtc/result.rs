//! One function per NVRTC call, each returning `Result<_, NvrtcError>` with the status named.

use std::ffi::{c_int, CStr, CString};
use std::ptr;

use super::sys::{Nvrtc, NvrtcProgram, NvrtcResult};
use super::NvrtcError;

crate::status_type! {
    /// An NVRTC status code.
    pub struct NvrtcStatus(NvrtcResult), unnamed "NVRTC_ERROR_(unnamed)" {
        SUCCESS = 0 => "NVRTC_SUCCESS",
        OUT_OF_MEMORY = 1 => "NVRTC_ERROR_OUT_OF_MEMORY",
        PROGRAM_CREATION_FAILURE = 2 => "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        INVALID_INPUT = 3 => "NVRTC_ERROR_INVALID_INPUT",
        INVALID_PROGRAM = 4 => "NVRTC_ERROR_INVALID_PROGRAM",
        INVALID_OPTION = 5 => "NVRTC_ERROR_INVALID_OPTION",
        COMPILATION = 6 => "NVRTC_ERROR_COMPILATION",
        BUILTIN_OPERATION_FAILURE = 7 => "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        INTERNAL_ERROR = 11 => "NVRTC_ERROR_INTERNAL_ERROR",
    }
}

fn check(call: &'static str, status: NvrtcResult) -> Result<(), NvrtcError> {
    NvrtcStatus(status)
        .result()
        .map_err(|status| NvrtcError::Call { call, status })
}

pub(super) fn version(n: &Nvrtc) -> Result<(i32, i32), NvrtcError> {
    let (mut a, mut b): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints.
    check("nvrtcVersion", unsafe { (n.version)(&mut a, &mut b) })?;
    Ok((a, b))
}

pub(super) fn supported_archs(n: &Nvrtc) -> Result<Vec<i32>, NvrtcError> {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    check("nvrtcGetNumSupportedArchs", unsafe {
        (n.get_num_supported_archs)(&mut count)
    })?;
    let mut v = vec![0 as c_int; usize::try_from(count).unwrap_or(0)];
    // SAFETY: `v` holds exactly the number of ints NVRTC said it will write.
    check("nvrtcGetSupportedArchs", unsafe {
        (n.get_supported_archs)(v.as_mut_ptr())
    })?;
    Ok(v)
}

/// An NVRTC program, destroyed on drop.
pub(super) struct Program<'n> {
    raw: NvrtcProgram,
    n: &'n Nvrtc,
}

pub(super) fn create_program<'n>(
    n: &'n Nvrtc,
    source: &str,
    name: &str,
) -> Result<Program<'n>, NvrtcError> {
    let src = CString::new(source).map_err(|_| NvrtcError::Source("NUL byte in source".into()))?;
    let name = CString::new(name).map_err(|_| NvrtcError::Source("NUL byte in name".into()))?;
    let mut raw: NvrtcProgram = ptr::null_mut();
    // SAFETY: both strings are NUL-terminated and alive for the call; no headers are passed.
    check("nvrtcCreateProgram", unsafe {
        (n.create_program)(
            &mut raw,
            src.as_ptr(),
            name.as_ptr(),
            0,
            ptr::null(),
            ptr::null(),
        )
    })?;
    Ok(Program { raw, n })
}

impl Program<'_> {
    /// Compiles; on a compile error returns the raw status (the caller fetches the log).
    pub(super) fn compile(&self, options: &[String]) -> Result<(), NvrtcError> {
        let opts: Vec<CString> = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<_, _>>()
            .map_err(|_| NvrtcError::Source("NUL byte in an option".into()))?;
        let ptrs: Vec<*const std::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let len = c_int::try_from(ptrs.len())
            .map_err(|_| NvrtcError::Source(format!("{} options", ptrs.len())))?;
        // SAFETY: the program is live; `ptrs` holds `len` NUL-terminated strings kept alive by
        // `opts` for the call.
        check("nvrtcCompileProgram", unsafe {
            (self.n.compile_program)(self.raw, len, ptrs.as_ptr())
        })
    }

    pub(super) fn log(&self) -> Result<String, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: the program is live; writes one size_t.
        check("nvrtcGetProgramLogSize", unsafe {
            (self.n.get_program_log_size)(self.raw, &mut size)
        })?;
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the size NVRTC asked for (including the NUL).
        check("nvrtcGetProgramLog", unsafe {
            (self.n.get_program_log)(self.raw, buf.as_mut_ptr().cast())
        })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).trim_end().to_string())
    }

    pub(super) fn cubin(&self) -> Result<Vec<u8>, NvrtcError> {
        let mut size = 0usize;
        // SAFETY: the program is live and compiled; writes one size_t.
        check("nvrtcGetCUBINSize", unsafe {
            (self.n.get_cubin_size)(self.raw, &mut size)
        })?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` holds exactly the size NVRTC reported.
            check("nvrtcGetCUBIN", unsafe {
                (self.n.get_cubin)(self.raw, buf.as_mut_ptr().cast())
            })?;
        }
        Ok(buf)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        // SAFETY: `self` owns the program.
        let rc = unsafe { (self.n.destroy_program)(&mut self.raw) };
        if rc != 0 {
            tracing::warn!(status = %NvrtcStatus(rc), "nvrtcDestroyProgram failed");
        }
    }
}

/// NVRTC's own text for a status.
pub(super) fn error_string(n: &Nvrtc, status: NvrtcStatus) -> String {
    // SAFETY: returns a pointer to a static string (or null).
    let p = unsafe { (n.get_error_string)(status.0) };
    if p.is_null() {
        return status.name().to_string();
    }
    // SAFETY: non-null results are NUL-terminated static strings.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
