//! What both emulated NVIDIA libraries (the libcuda and libnvjpeg stand-ins) do at their C
//! boundary: write an out-parameter, and run an exported call with panics caught.
//!
//! # Design
//! Generic over the library's status type: each library keeps its own codes (`CUresult`,
//! `nvjpegStatus_t`) and names, in one [`Boundary`], the ones it returns for success, for a
//! null out-parameter and after a panic.
//!
//! # Limitations
//! Only the steps both libraries share; what comes before a call (the emulator gate, the
//! driver's initialisation check and fault injection) stays with each library.

/// One library's C boundary: its name (for messages) and the statuses it returns.
#[derive(Debug, Clone, Copy)]
pub struct Boundary<S> {
    /// Names the library in messages on stderr.
    pub library: &'static str,
    /// Returned by a call that succeeded (`CUDA_SUCCESS`, `NVJPEG_STATUS_SUCCESS`).
    pub success: S,
    /// Returned for a null out-parameter.
    pub null_pointer: S,
    /// Returned after a panic.
    pub panicked: S,
}

impl<S: Copy> Boundary<S> {
    /// Writes `v` through an out-parameter; a null pointer is `self.null_pointer`.
    ///
    /// # Safety
    /// `p` must be null or valid for a write of `T`.
    pub unsafe fn write_out<T>(&self, p: *mut T, v: T) -> Result<(), S> {
        if p.is_null() {
            return Err(self.null_pointer);
        }
        // SAFETY: non-null and valid by the caller's promise.
        unsafe { p.write(v) };
        Ok(())
    }

    /// Runs the exported call `call` with panics caught (a bug in the emulator must not
    /// unwind into C): `Ok` is `self.success`, `Err` its status, a panic `self.panicked`
    /// after a line on stderr naming the call.
    pub fn guarded(&self, call: &str, f: impl FnOnce() -> Result<(), S>) -> S {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Ok(())) => self.success,
            Ok(Err(status)) => status,
            Err(_) => {
                eprintln!("{}: internal panic in {call}", self.library);
                self.panicked
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: Boundary<i32> = Boundary {
        library: "lib",
        success: 0,
        null_pointer: 2,
        panicked: 99,
    };

    #[test]
    fn out_parameters_are_written_and_null_is_the_given_status() {
        let mut slot = 0u32;
        // SAFETY: a local, then null.
        unsafe {
            assert_eq!(LIB.write_out(&mut slot, 7), Ok(()));
            assert_eq!(LIB.write_out(std::ptr::null_mut::<u32>(), 7), Err(2));
        }
        assert_eq!(slot, 7);
    }

    #[test]
    fn calls_return_their_status_and_a_panic_becomes_the_panic_status() {
        assert_eq!(LIB.guarded("ok", || Ok(())), 0);
        assert_eq!(LIB.guarded("fails", || Err(3)), 3);
        assert_eq!(LIB.guarded("panics", || panic!("a bug")), 99);
    }
}
