//! Finding and opening NVIDIA's shared libraries at run time.
//!
//! stoker is one binary for every host: nothing links libcuda, libnvrtc or libnvjpeg at build
//! time. Each library is looked for in a fixed, documented order (docs/cuda.md), and failing to
//! find it is an error value saying every place that was tried, never a panic.
//!
//! # Search order
//! 1. The library's own environment variable (`STOKER_NVRTC`, `STOKER_NVJPEG`, `STOKER_LIBCUDA`):
//!    a path to the file. If set, only that path is tried.
//! 2. The standard sonames, through the dynamic loader (`LD_LIBRARY_PATH`, ld.so.cache, RUNPATH).
//! 3. The PyPI wheel layouts (`nvidia/cu13/lib/`, `nvidia/<component>/lib/`) under each wheel
//!    root: `$STOKER_NVIDIA_DIR`, `$XDG_CACHE_HOME/stoker/nvidia` (or `~/.cache/stoker/nvidia`,
//!    where `scripts/cuda-wheels` installs them), then the site-packages of `$VIRTUAL_ENV`,
//!    `$CONDA_PREFIX`, `~/.local`, `/usr/local` and `/usr` (every `python3.*`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use libloading::Library;

/// Where one NVIDIA library may be found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LibrarySpec {
    /// Short name for messages: `libnvrtc`.
    pub(crate) name: &'static str,
    /// Environment variable naming the file directly.
    pub(crate) env: &'static str,
    /// Sonames tried through the dynamic loader, newest first.
    pub(crate) sonames: &'static [&'static str],
    /// Directories, relative to a wheel root (the folder holding `nvidia/`), that hold it.
    pub(crate) wheel_dirs: &'static [&'static str],
}

/// Environment variable naming the folder the PyPI wheels were installed into (`pip --target`).
pub const NVIDIA_DIR_ENV: &str = "STOKER_NVIDIA_DIR";

/// A library that was opened, and the name or path it was opened by.
#[derive(Debug)]
pub struct Loaded {
    /// The open library; closed when the last table made from it is dropped.
    pub library: Library,
    /// The path it was opened from, or the soname the dynamic loader resolved.
    pub origin: PathBuf,
}

/// The default wheel folder `scripts/cuda-wheels` installs into:
/// `$XDG_CACHE_HOME/stoker/nvidia`, else `~/.cache/stoker/nvidia`.
pub fn default_wheel_dir() -> Option<PathBuf> {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return Some(PathBuf::from(x).join("stoker/nvidia"));
    }
    std::env::var_os("HOME")
        .filter(|v| !v.is_empty())
        .map(|h| PathBuf::from(h).join(".cache/stoker/nvidia"))
}

/// The wheel folder tests use: `$STOKER_NVIDIA_DIR`, else [`default_wheel_dir`].
pub fn wheel_dir() -> Option<PathBuf> {
    std::env::var_os(NVIDIA_DIR_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(default_wheel_dir)
}

/// Every folder that may hold a `nvidia/` wheel tree, in search order.
pub(crate) fn wheel_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os(NVIDIA_DIR_ENV).filter(|v| !v.is_empty()) {
        roots.push(d.into());
    }
    roots.extend(default_wheel_dir());
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            prefixes.push(p.into());
        }
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        prefixes.push(PathBuf::from(h).join(".local"));
    }
    prefixes.push("/usr/local".into());
    prefixes.push("/usr".into());
    for prefix in prefixes {
        roots.extend(site_packages(&prefix));
    }
    roots.push("/usr/lib/python3/dist-packages".into());
    roots.dedup();
    roots
}

/// `<prefix>/lib/python3.*/{site,dist}-packages` that exist, sorted newest Python first.
fn site_packages(prefix: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut pythons: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path())
        .collect();
    pythons.sort();
    pythons.reverse();
    let mut out = Vec::new();
    for p in pythons {
        for sub in ["site-packages", "dist-packages"] {
            let d = p.join(sub);
            if d.is_dir() {
                out.push(d);
            }
        }
    }
    out
}

impl LibrarySpec {
    /// Every candidate in search order: the env path alone if set, else sonames then wheel files.
    pub(crate) fn candidates(&self) -> Vec<PathBuf> {
        if let Some(p) = std::env::var_os(self.env).filter(|v| !v.is_empty()) {
            return vec![PathBuf::from(p)];
        }
        let mut out: Vec<PathBuf> = self.sonames.iter().map(PathBuf::from).collect();
        for root in wheel_roots() {
            out.extend(self.wheel_candidates(&root));
        }
        out
    }

    /// The files this library would have in the wheel tree under `root`.
    pub(crate) fn wheel_candidates(&self, root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for dir in self.wheel_dirs {
            for so in self.sonames {
                let p = root.join(dir).join(so);
                if p.is_file() {
                    out.push(p);
                }
            }
        }
        out
    }

    /// Opens the first candidate that loads. The error lists every attempt and why it failed.
    pub(crate) fn open(&self) -> Result<Loaded, LoadError> {
        open_first(&self.candidates(), self.env)
    }

    /// Opens one candidate; the error is [`LoadError::Tried`] with the one attempt.
    pub(crate) fn open_candidate(&self, path: &Path) -> Result<Loaded, LoadError> {
        open_first(std::slice::from_ref(&path.to_path_buf()), self.env)
    }

    /// Opens the library from the wheel tree under `root` only (tests pin the wheel this way).
    pub(crate) fn open_from_wheel(&self, root: &Path) -> Result<Loaded, LoadError> {
        let c = self.wheel_candidates(root);
        if c.is_empty() {
            return Err(LoadError::NotInWheel {
                library: self.name,
                root: root.to_owned(),
                dirs: self.wheel_dirs,
            });
        }
        open_first(&c, self.env)
    }
}

/// Why a library, or a symbol of it, could not be loaded. The message names every file tried.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The wheel tree under `root` has none of the library's files.
    #[error("no {library} under {} (looked in {})", .root.display(), .dirs.join(", "))]
    NotInWheel {
        /// The library's short name (`libnvrtc`).
        library: &'static str,
        /// The wheel root looked in (the folder holding `nvidia/`).
        root: PathBuf,
        /// The folders under `root` that were looked in.
        dirs: &'static [&'static str],
    },
    /// The search order named no file at all.
    #[error("nothing to try (set {env})")]
    NothingToTry {
        /// The environment variable that names the library's file.
        env: &'static str,
    },
    /// Every candidate failed to load or was passed over.
    #[error("tried {}", .attempts.join("; "))]
    Tried {
        /// Each attempt as `path: why`, in search order, then any hint on what to install.
        attempts: Vec<String>,
    },
    /// The library loaded but lacks a symbol stoker calls.
    #[error("symbol {name}: {source}")]
    Symbol {
        /// The symbol as the library's header spells it (`cuInit`).
        name: String,
        /// The dynamic loader's reason.
        source: Arc<libloading::Error>,
    },
    /// A symbol table that could not be resolved in the library at `origin`.
    #[error("{}: {source}", .origin.display())]
    Table {
        /// The library's path or soname.
        origin: PathBuf,
        /// Why the table could not be resolved (a missing [`LoadError::Symbol`]).
        source: Box<LoadError>,
    },
}

fn open_first(candidates: &[PathBuf], env: &'static str) -> Result<Loaded, LoadError> {
    let mut tried: Vec<String> = Vec::new();
    for c in candidates {
        // SAFETY: loading an NVIDIA library runs its initialisers; they have no preconditions on
        // our side, and every library named here is a plain C library without global
        // constructors that could conflict with ours.
        match unsafe { Library::new(OsString::from(c.as_os_str())) } {
            Ok(library) => {
                return Ok(Loaded {
                    library,
                    origin: c.clone(),
                })
            }
            Err(e) => tried.push(format!("{}: {e}", c.display())),
        }
    }
    if tried.is_empty() {
        return Err(LoadError::NothingToTry { env });
    }
    Err(LoadError::Tried { attempts: tried })
}

/// Looks up `name` in `lib` as a function pointer of type `T`.
///
/// # Safety
/// `T` must be the `extern "C" fn` type the library's header declares for `name`.
pub unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, LoadError> {
    // SAFETY: the caller promises `T` is the symbol's true type; the library outlives the
    // returned pointer because every binding keeps its `Library` next to its function table.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| LoadError::Symbol {
            name: name.to_owned(),
            source: Arc::new(e),
        })
}

/// Declares a loaded library's function table: one struct holding a pointer per symbol (and
/// the library, last, so no pointer outlives it), and its `load(Loaded)` that resolves them
/// all or says which one is missing. The pointers are visible to the declaring crate only:
/// its `result` layer makes every call. The one way libcuda, NVRTC and nvJPEG are bound.
///
/// Each entry is `field = "symbol": fn(ARGS);` for a function returning `$status`, or
/// `field = "symbol": fn(ARGS) -> RET;` for one returning something else. The argument and
/// return types must be copied from the library's header (named after `from`, for the
/// reader): that is what makes the `load` sound, and why the macro is the only place (besides
/// `sys` modules' own FFI structs) where these bindings are unsafe.
#[macro_export]
macro_rules! symbol_table {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident, status $status:ty, from $header:literal {
            $( $field:ident = $sym:literal : fn($($arg:ty),* $(,)?) $(-> $ret:ty)?; )*
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                #[doc = concat!("`", $sym, "`.")]
                pub(crate) $field: unsafe extern "C" fn($($arg),*) -> $crate::symbol_table!(@ret $status $(, $ret)?), )*
            /// Kept last so the pointers above never outlive it (fields drop in order).
            _library: $crate::loader::Library,
        }

        /// The pointers say nothing to a reader: only the table's name is shown.
        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(concat!(stringify!($name), " { .. }"))
            }
        }

        impl $name {
            /// Resolves every symbol of the table in `loaded`; an error starts with the
            /// library's path.
            // The metavariables inside `unsafe` are identifiers and string literals only (the
            // macro's grammar admits no expressions), so no caller code runs unsafely.
            #[allow(clippy::macro_metavars_in_unsafe)]
            $vis fn load(
                loaded: $crate::loader::Loaded,
            ) -> Result<$name, $crate::loader::LoadError> {
                let $crate::loader::Loaded { library, origin } = loaded;
                let resolve = || -> Result<$name, $crate::loader::LoadError> {
                    // SAFETY: each entry's type is copied from the library's header (named in
                    // the table) for that symbol; the library is kept beside the pointers.
                    unsafe {
                        Ok($name {
                            $( $field: $crate::loader::symbol(&library, $sym)?, )*
                            _library: library,
                        })
                    }
                };
                resolve().map_err(|r| $crate::loader::LoadError::Table {
                    origin,
                    source: Box::new(r),
                })
            }
        }
    };
    (@ret $status:ty) => { $status };
    (@ret $status:ty, $ret:ty) => { $ret };
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAKE: LibrarySpec = LibrarySpec {
        name: "libstoker-does-not-exist",
        env: "STOKER_TEST_FAKE_LIB",
        sonames: &["libstoker-does-not-exist.so.1"],
        wheel_dirs: &["nvidia/cu13/lib"],
    };

    #[test]
    fn a_missing_library_is_an_error_listing_what_was_tried() {
        let err = FAKE.open().unwrap_err();
        assert!(
            err.to_string().contains("libstoker-does-not-exist.so.1"),
            "{err}"
        );
    }

    #[test]
    fn wheel_candidates_follow_the_wheel_layout() {
        let dir = std::env::temp_dir().join(format!("stoker-loader-{}", std::process::id()));
        let lib = dir.join("nvidia/cu13/lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("libstoker-does-not-exist.so.1"), b"not elf").unwrap();
        let c = FAKE.wheel_candidates(&dir);
        assert_eq!(c, vec![lib.join("libstoker-does-not-exist.so.1")]);
        // A file that is not a library is an error, not a crash.
        let err = FAKE.open_from_wheel(&dir).unwrap_err();
        assert!(
            err.to_string().contains("libstoker-does-not-exist.so.1"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
