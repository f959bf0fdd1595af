//! Which NVRTC and nvJPEG this driver can run: the CUDA major of a library against the driver's
//! `cuDriverGetVersion`.
//!
//! # Design
//! - NVIDIA's compatibility guide ("CUDA Toolkit 11.x, 12.x, and 13.x Minimum and Maximum
//!   Required Driver Versions", docs/cuda.md "Library versions against the driver"): CUDA 13.x
//!   needs a driver >= 580, CUDA 12.x >= 525; within a major, minor-version compatibility lets
//!   a newer toolkit minor run on the major's first driver; a newer major does not run on an
//!   older driver. `cuDriverGetVersion` reports the newest CUDA the driver runs (12080 for an
//!   R570 driver, 13000 for R580), so a library of major M runs when M <= its major. Older
//!   majors run on newer drivers (backward compatibility).
//! - [`open_for_driver`] walks a library's candidates in the search order (newest major first)
//!   and takes the first one that loads and whose major the driver runs; each one passed over
//!   is named in the error with its version and why. Without a driver (a CI machine compiling
//!   kernels) nothing is refused: there is nothing to run the code on.
//!
//! # Limitations
//! The forward-compatibility package (`cuda-compat`) makes an older driver report the newer
//! CUDA it brings; that is the version used, as the runtime would.

use std::fmt;
use std::sync::OnceLock;

use crate::loader::{LibrarySpec, LoadError, Loaded};

/// A CUDA version as `cuDriverGetVersion` reports it: 1000 * major + 10 * minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion(
    /// The raw number: 12080 for CUDA 12.8.
    pub i32,
);

impl CudaVersion {
    /// The CUDA major: 12 for 12080.
    pub fn major(self) -> i32 {
        self.0 / 1000
    }

    /// The CUDA minor: 8 for 12080.
    pub fn minor(self) -> i32 {
        self.0 % 1000 / 10
    }

    /// The driver branch a CUDA major first ran on (NVIDIA's compatibility guide).
    pub(crate) fn first_driver_branch(major: i32) -> Option<u32> {
        match major {
            13 => Some(580),
            12 => Some(525),
            11 => Some(450),
            _ => None,
        }
    }

    /// An error when a library of CUDA `major` (version `what`, e.g. "NVRTC 13.5") cannot
    /// run on a driver reporting this version.
    pub(crate) fn runs(self, major: i32, what: &str) -> Result<(), TooNewForDriver> {
        if major <= self.major() {
            return Ok(());
        }
        Err(TooNewForDriver {
            what: what.to_owned(),
            major,
            driver: self,
        })
    }
}

/// A library of a newer CUDA major than the driver runs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{what} is CUDA {major}, which needs a driver that runs CUDA {major}{branch}; \
     this driver runs CUDA {driver}",
    branch = CudaVersion::first_driver_branch(*.major)
        .map(|b| format!(" (driver {b} or newer)"))
        .unwrap_or_default()
)]
pub(crate) struct TooNewForDriver {
    /// The library and its version, for the message: `NVRTC 13.5`.
    what: String,
    /// The library's CUDA major.
    major: i32,
    /// What the driver runs.
    driver: CudaVersion,
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major(), self.minor())
    }
}

/// The loaded driver's version, read once; `None` where no driver loads (nothing to run on).
pub(crate) fn driver_version() -> Option<CudaVersion> {
    static V: OnceLock<Option<CudaVersion>> = OnceLock::new();
    *V.get_or_init(|| {
        let d = crate::cuda::driver().ok()?;
        crate::cuda::result::driver_version(d).ok().map(CudaVersion)
    })
}

/// What to do after a library of CUDA major too new for the driver was passed over.
pub(crate) const OLDER_DRIVER_HINT: &str =
    "install the libraries of the CUDA major the driver runs \
     (scripts/cuda-wheels picks the CUDA 12 wheels for a driver older than 580)";

/// Opens the first candidate of `spec` that loads (`open` resolves and asks its version) and
/// whose CUDA major (`major`) `driver` runs. The error names every candidate and why not.
pub(crate) fn open_for_driver<T, E: fmt::Display>(
    spec: &LibrarySpec,
    driver: Option<CudaVersion>,
    open: impl Fn(Loaded) -> Result<T, E>,
    describe: impl Fn(&T) -> (i32, String),
) -> Result<T, LoadError> {
    let mut attempts: Vec<String> = Vec::new();
    let mut too_new = false;
    for candidate in spec.candidates() {
        let loaded = match spec.open_candidate(&candidate) {
            Ok(l) => l,
            Err(LoadError::Tried { attempts: why }) => {
                attempts.extend(why);
                continue;
            }
            Err(other) => {
                attempts.push(other.to_string());
                continue;
            }
        };
        let lib = match open(loaded) {
            Ok(lib) => lib,
            Err(why) => {
                attempts.push(format!("{}: {why}", candidate.display()));
                continue;
            }
        };
        let (major, what) = describe(&lib);
        match driver.map_or(Ok(()), |d| d.runs(major, &what)) {
            Ok(()) => return Ok(lib),
            Err(why) => {
                too_new = true;
                attempts.push(format!("{}: {why}", candidate.display()));
            }
        }
    }
    if attempts.is_empty() {
        return Err(LoadError::NothingToTry { env: spec.env });
    }
    if too_new {
        attempts.push(OLDER_DRIVER_HINT.to_string());
    }
    Err(LoadError::Tried { attempts })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_library_runs_on_a_driver_of_its_major_or_newer() {
        let r570 = CudaVersion(12080);
        let r580 = CudaVersion(13000);
        assert_eq!(r570.to_string(), "12.8");
        assert!(
            r570.runs(12, "NVRTC 12.9").is_ok(),
            "minor-version compatibility"
        );
        assert!(
            r580.runs(12, "nvJPEG 12.4").is_ok(),
            "backward compatibility"
        );
        assert!(r580.runs(13, "NVRTC 13.5").is_ok());
        let why = r570.runs(13, "NVRTC 13.5").unwrap_err();
        assert_eq!(
            why.to_string(),
            "NVRTC 13.5 is CUDA 13, which needs a driver that runs CUDA 13 (driver 580 or \
             newer); this driver runs CUDA 12.8"
        );
    }
}
