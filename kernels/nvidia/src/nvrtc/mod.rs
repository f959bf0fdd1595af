//! NVRTC, loaded at run time: compiles stoker's `.cu` kernels to a cubin for one compute
//! capability, with a disk cache so a daemon start does not recompile.
//!
//! # Design
//! - libnvrtc is found as [`crate::loader`] says (`STOKER_NVRTC`, then `libnvrtc.so.13`,
//!   `.so.12`, `libnvrtc.so`, then the PyPI wheel `nvidia-cuda-nvrtc` under a wheel root):
//!   the first whose CUDA major the driver runs ([`crate::compat`]), since the driver refuses
//!   a cubin of a newer major.
//! - Options are fixed per build: `--gpu-architecture=sm_XX --std=c++17 --fmad=false`.
//!   `--fmad=false` keeps the GPU's rounding that of the CPU reference (no fused multiply-add
//!   contraction), so kernel and reference agree to the last bit in almost every pixel.
//! - A compile error keeps NVRTC's log and the options in [`NvrtcError::Compile`].
//! - [`KernelCache`]: cubins in `$STOKER_CACHE_DIR/kernels`, else
//!   `$XDG_CACHE_HOME/stoker/kernels`, else `~/.cache/stoker/kernels`, named by a 128-bit
//!   FNV-1a hash of (source, options, NVRTC version, arch). Written to a temporary file and
//!   renamed, so a crash never leaves half a cubin; a file that is not an ELF image is ignored
//!   and rebuilt. The folder is private (`stoker_private`: 0700, cubins 0600); one another
//!   user owns or may write to is not used (a warning names it and why), since a cubin is
//!   code the GPU runs.
//!
//! # Limitations
//! - A device newer than the NVRTC in use (arch not in `nvrtcGetSupportedArchs`) is an error;
//!   we do not fall back to PTX.

mod result;
mod sys;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

pub use result::NvrtcStatus;

use crate::loader::Loaded;

/// What can go wrong compiling a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvrtcError {
    /// libnvrtc or one of its symbols is missing.
    #[error("{library} unavailable: {reason}")]
    Unavailable {
        /// The library's short name (`libnvrtc`).
        library: String,
        /// What was tried and why it failed.
        reason: String,
    },
    /// An NVRTC call other than the compile itself failed.
    #[error("{call} failed: {status}")]
    Call {
        /// The call as `nvrtc.h` names it (`nvrtcGetCUBIN`).
        call: &'static str,
        /// The status it returned.
        status: NvrtcStatus,
    },
    /// The source does not compile; the log says why.
    #[error("{name} does not compile for {arch} (options: {options}):\n{log}", options = .options.join(" "))]
    Compile {
        /// The source's name (`augment.cu`).
        name: String,
        /// The target, as in the options (`sm_90`).
        arch: String,
        /// The options the compile was given.
        options: Vec<String>,
        /// NVRTC's compile log.
        log: String,
    },
    /// This NVRTC cannot build for the device.
    #[error("NVRTC {version} cannot compile for sm_{arch} (it supports {supported:?})")]
    UnsupportedArch {
        /// The device's compute capability as 10 * major + minor (90 for sm_90).
        arch: u32,
        /// The NVRTC version, `major.minor`.
        version: String,
        /// The capabilities it can target, as `nvrtcGetSupportedArchs` lists them.
        supported: Vec<i32>,
    },
    /// The source or an option is not a C string.
    #[error("bad kernel source: {0}")]
    Source(String),
}

impl NvrtcError {
    /// True where libnvrtc or a symbol is missing rather than a call failing.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, NvrtcError::Unavailable { .. })
    }
}

/// A kernel source file and its name (used in NVRTC's messages).
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// The file name NVRTC's messages and the cache key use (`augment.cu`).
    pub name: &'static str,
    /// The CUDA C++ source text.
    pub source: &'static str,
}

/// A loaded libnvrtc.
#[derive(Debug)]
pub struct Nvrtc {
    sys: sys::Nvrtc,
    origin: PathBuf,
    version: (i32, i32),
}

static GLOBAL: OnceLock<Result<Nvrtc, NvrtcError>> = OnceLock::new();

fn unavailable(reason: crate::loader::LoadError) -> NvrtcError {
    NvrtcError::Unavailable {
        library: "libnvrtc".into(),
        reason: reason.to_string(),
    }
}

impl Nvrtc {
    /// The process's NVRTC: the first in the search order whose CUDA major the driver runs
    /// ([`crate::compat`]; any, where no driver loads), found on first use.
    pub fn global() -> Result<&'static Nvrtc, NvrtcError> {
        GLOBAL
            .get_or_init(|| {
                crate::compat::open_for_driver(
                    &sys::LIBNVRTC,
                    crate::compat::driver_version(),
                    Nvrtc::open,
                    |n| {
                        (
                            n.version.0,
                            format!("NVRTC {}.{}", n.version.0, n.version.1),
                        )
                    },
                )
                .map_err(unavailable)
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// NVRTC from the PyPI wheel tree under `root` only (what CI tests).
    pub fn load_from_wheel(root: &Path) -> Result<Nvrtc, NvrtcError> {
        Nvrtc::open(sys::LIBNVRTC.open_from_wheel(root).map_err(unavailable)?)
    }

    fn open(loaded: Loaded) -> Result<Nvrtc, NvrtcError> {
        let origin = loaded.origin.clone();
        let sys = sys::Nvrtc::load(loaded).map_err(unavailable)?;
        let version = result::version(&sys)?;
        tracing::debug!(library = %origin.display(), ?version, "loaded NVRTC");
        Ok(Nvrtc {
            sys,
            origin,
            version,
        })
    }

    /// (major, minor), e.g. (13, 0).
    pub fn version(&self) -> (i32, i32) {
        self.version
    }

    /// The file or soname it was loaded from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Compute capabilities this NVRTC can target, as 10 * major + minor (80, 90, ...).
    pub(crate) fn supported_archs(&self) -> Result<Vec<i32>, NvrtcError> {
        result::supported_archs(&self.sys)
    }

    /// The options stoker compiles with for `sm_<arch>` (arch = 10 * major + minor).
    pub fn options(arch: u32) -> Vec<String> {
        vec![
            format!("--gpu-architecture=sm_{arch}"),
            "--std=c++17".into(),
            "--fmad=false".into(),
        ]
    }

    /// Compiles `src` to a cubin for `sm_<arch>`.
    pub fn compile(&self, src: &KernelSource, arch: u32) -> Result<Vec<u8>, NvrtcError> {
        self.compile_str(src.name, src.source, arch)
    }

    /// Compiles a source given as a string (tests use it for files on disk).
    pub fn compile_str(&self, name: &str, source: &str, arch: u32) -> Result<Vec<u8>, NvrtcError> {
        let supported = self.supported_archs()?;
        if !i32::try_from(arch).is_ok_and(|a| supported.contains(&a)) {
            return Err(NvrtcError::UnsupportedArch {
                arch,
                version: format!("{}.{}", self.version.0, self.version.1),
                supported,
            });
        }
        let options = Nvrtc::options(arch);
        let prog = result::create_program(&self.sys, source, name)?;
        match prog.compile(&options) {
            Ok(()) => {}
            Err(NvrtcError::Call { status, .. })
                if status == NvrtcStatus::COMPILATION || status == NvrtcStatus::INVALID_OPTION =>
            {
                let log = prog.log().unwrap_or_else(|e| format!("(no log: {e})"));
                let log = if log.is_empty() {
                    result::error_string(&self.sys, status)
                } else {
                    log
                };
                return Err(NvrtcError::Compile {
                    name: name.to_string(),
                    arch: format!("sm_{arch}"),
                    options,
                    log,
                });
            }
            Err(e) => return Err(e),
        }
        let log = prog.log().unwrap_or_default();
        if !log.is_empty() {
            tracing::debug!(kernel = name, arch, %log, "NVRTC warnings");
        }
        prog.cubin()
    }
}

/// Cubins on disk, keyed by everything that changes them.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    /// `$STOKER_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/stoker/kernels`, else
    /// `~/.cache/stoker/kernels`; `None` when none can be named (no HOME).
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        if let Some(d) = var("STOKER_CACHE_DIR") {
            return Some(d.join("kernels"));
        }
        if let Some(d) = var("XDG_CACHE_HOME") {
            return Some(d.join("stoker/kernels"));
        }
        var("HOME").map(|h| h.join(".cache/stoker/kernels"))
    }

    /// A cache in `dir` (created, private to this user, on first use).
    pub fn new(dir: impl Into<PathBuf>) -> KernelCache {
        KernelCache { dir: dir.into() }
    }

    /// The folder the cubins are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key of a build: FNV-1a 128 over length-prefixed fields.
    pub fn key(source: &str, options: &[String], nvrtc_version: (i32, i32), arch: u32) -> u128 {
        let mut h = Fnv128::new();
        h.field(source.as_bytes());
        for o in options {
            h.field(o.as_bytes());
        }
        h.field(format!("nvrtc {}.{}", nvrtc_version.0, nvrtc_version.1).as_bytes());
        h.field(format!("sm_{arch}").as_bytes());
        h.0
    }

    /// Where the cubin of this build lives.
    pub fn path(&self, name: &str, key: u128, arch: u32) -> PathBuf {
        let stem = name.trim_end_matches(".cu");
        self.dir.join(format!("{stem}-sm_{arch}-{key:032x}.cubin"))
    }

    /// The cubin for `src` on `sm_<arch>`: from disk when present and well-formed, else
    /// compiled and stored. A cache that cannot be written only costs a recompile next time.
    pub fn get_or_compile(
        &self,
        nvrtc: &Nvrtc,
        src: &KernelSource,
        arch: u32,
    ) -> Result<Vec<u8>, NvrtcError> {
        let key = KernelCache::key(src.source, &Nvrtc::options(arch), nvrtc.version(), arch);
        let path = self.path(src.name, key, arch);
        let private = self.private();
        if private {
            if let Some(bytes) = self.load(&path) {
                return Ok(bytes);
            }
        }
        let cubin = nvrtc.compile(src, arch)?;
        if private {
            if let Err(e) = self.store(&path, &cubin) {
                tracing::warn!(path = %path.display(), error = %e, "cannot cache a cubin");
            }
        }
        Ok(cubin)
    }

    /// Whether the folder is (made) private to this uid: a cubin is code the GPU runs, so one
    /// from a folder another user owns or may write to is never loaded (nor written there).
    fn private(&self) -> bool {
        match stoker_private::ensure_dir(&self.dir) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "not using the kernel cache; compiling instead");
                false
            }
        }
    }

    fn load(&self, path: &Path) -> Option<Vec<u8>> {
        let bytes = std::fs::read(path).ok()?;
        if is_elf(&bytes) {
            return Some(bytes);
        }
        tracing::warn!(path = %path.display(), "ignoring a corrupt cached cubin");
        None
    }

    /// Writes a cubin mode 0600 under a temporary name, then renames it into place.
    fn store(&self, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
        stoker_private::write_file(&tmp, bytes)?;
        std::fs::rename(&tmp, path)
    }
}

fn is_elf(bytes: &[u8]) -> bool {
    bytes.len() > 64 && bytes.starts_with(b"\x7fELF")
}

/// FNV-1a with 128-bit state: stable across builds and platforms (std's hasher is not).
struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    fn new() -> Fnv128 {
        Fnv128(Fnv128::OFFSET)
    }

    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u128;
            self.0 = self.0.wrapping_mul(Fnv128::PRIME);
        }
    }

    /// A length prefix keeps ("ab", "c") and ("a", "bc") apart.
    fn field(&mut self, b: &[u8]) {
        self.bytes(&(b.len() as u64).to_le_bytes());
        self.bytes(b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv128_matches_the_published_vectors() {
        let mut h = Fnv128::new();
        h.bytes(b"");
        assert_eq!(h.0, 0x6c62272e07bb014262b821756295c58d);
        let mut h = Fnv128::new();
        h.bytes(b"a");
        assert_eq!(h.0, 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn cache_keys_change_with_every_input() {
        let o = Nvrtc::options(90);
        let k = KernelCache::key("src", &o, (13, 0), 90);
        assert_eq!(k, KernelCache::key("src", &o, (13, 0), 90));
        assert_ne!(k, KernelCache::key("src ", &o, (13, 0), 90));
        assert_ne!(k, KernelCache::key("src", &Nvrtc::options(80), (13, 0), 90));
        assert_ne!(k, KernelCache::key("src", &o, (13, 1), 90));
        assert_ne!(k, KernelCache::key("src", &o, (13, 0), 80));
    }

    #[test]
    fn cache_paths_name_kernel_arch_and_key() {
        let c = KernelCache::new("/c");
        assert_eq!(
            c.path("augment.cu", 0xab, 90),
            Path::new("/c/augment-sm_90-000000000000000000000000000000ab.cubin")
        );
    }

    #[test]
    fn cubins_are_stored_private_and_a_folder_of_another_uid_is_not_used() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let c = KernelCache::new(dir.path().join("kernels"));
        let elf = [b"\x7fELF".as_slice(), &[0u8; 80]].concat();
        assert!(c.private());
        let path = c.path("k.cu", 1, 90);
        c.store(&path, &elf).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!((mode(c.dir()), mode(&path)), (0o700, 0o600));
        assert_eq!(c.load(&path), Some(elf));
        std::fs::set_permissions(c.dir(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!c.private(), "a folder others may write to is refused");
        if stoker_private::euid() == 0 {
            std::fs::set_permissions(c.dir(), std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(c.dir(), Some(65534), Some(65534)).unwrap();
            assert!(!c.private(), "a folder of uid 65534 is refused");
        }
    }

    #[test]
    fn compile_errors_show_options_and_log() {
        let e = NvrtcError::Compile {
            name: "k.cu".into(),
            arch: "sm_90".into(),
            options: Nvrtc::options(90),
            log: "k.cu(3): error: expected a \";\"".into(),
        };
        let s = e.to_string();
        assert!(s.contains("--gpu-architecture=sm_90 --std=c++17"), "{s}");
        assert!(s.contains("expected a"), "{s}");
    }
}
