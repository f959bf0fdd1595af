//! Opening the libnvjpeg of a CUDA major the driver runs: nvJPEG's CUDA runtime refuses a
//! driver of an older major ([`crate::compat`]).

use super::{sys, unavailable, NvjpegError, NvjpegLib};

impl NvjpegLib {
    /// The first libnvjpeg in the search order whose major the loaded driver runs (any, where
    /// no driver loads); the error names each one passed over and why.
    pub(super) fn open_for_driver() -> Result<NvjpegLib, NvjpegError> {
        crate::compat::open_for_driver(
            &sys::LIBNVJPEG,
            crate::compat::driver_version(),
            NvjpegLib::open,
            |n| {
                let (major, minor, patch) = n.version;
                (major, format!("nvJPEG {major}.{minor}.{patch}"))
            },
        )
        .map_err(unavailable)
    }
}
