"""Builds the stoker wheel: this package plus libstoker.so, stokerd and stoker, compiled with
cargo from the checkout this folder sits in.

    pip install ./python            # from the repository root; needs cargo (a Rust toolchain)
    pip wheel --no-deps -w dist ./python

`build_py` runs `cargo build --locked --release -p stoker-client --lib -p stoker-daemon -p stoker-tool --bins`
and puts the results into the package: `stoker/libstoker.so`, `stoker/bin/stokerd`,
`stoker/bin/stoker`. Installing the wheel needs no Rust, cmake or nasm. The `stoker` and
`stokerd` commands are console entry points that run the bundled binaries.

The wheel is tagged `py3-none-<platform>`: no Python extension is inside (ctypes only), so
any CPython 3 takes it, but the binaries are for this platform only.

The wheel's version is the binaries' (`stokerd --version`, from `git describe` of the checkout;
`$STOKER_VERSION` when a packager sets it).

Environment: `STOKER_CARGO_PROFILE` (`release`, the default, or `dev`: CI's Python tests
reuse the debug build), `CARGO` (the cargo to run), `CARGO_TARGET_DIR`.

Why plain setuptools and not setuptools-rust: its `RustBin` installs binaries into the
environment's scripts folder, outside the package, where the library cannot find them
reliably (user installs, `--prefix`, relocated venvs), and its no-binding cdylib is renamed
with the interpreter's extension suffix although libstoker.so belongs to no interpreter. One
cargo command and three copies are all this needs (docs/python.md, "Building the wheel").
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# (file in the cargo target folder, where it goes in the package)
ARTIFACTS = [("libstoker.so", "libstoker.so"), ("stokerd", "bin/stokerd"), ("stoker", "bin/stoker")]


def cargo_build():
    """Builds the three artifacts; returns the folder they are in."""
    if not (REPO / "Cargo.toml").is_file() or not (REPO / "daemon").is_dir():
        sys.exit(f"stoker: building the wheel needs the stoker source checkout around {HERE} "
                 "(its Cargo workspace); install a built wheel instead")
    profile = os.environ.get("STOKER_CARGO_PROFILE", "release")
    if profile not in ("release", "dev"):
        sys.exit(f"stoker: STOKER_CARGO_PROFILE={profile!r}: use release or dev")
    cargo = os.environ.get("CARGO") or shutil.which("cargo")
    if not cargo:
        sys.exit("stoker: building from source needs cargo (a Rust toolchain, see "
                 "https://rustup.rs) on PATH or in $CARGO; or install a built wheel")
    cmd = [cargo, "build", "--locked", "--profile", profile, "-p", "stoker-client", "--lib",
           "-p", "stoker-daemon", "-p", "stoker-tool", "--bins"]
    sys.stderr.write(f"stoker: compiling the Rust daemon and library ({profile} profile): "
                     "several minutes the first time on a small machine, seconds after that\n"
                     f"stoker: {' '.join(cmd)}\n")
    subprocess.run(cmd, cwd=REPO, check=True)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / ("debug" if profile == "dev" else profile)


def binaries_version():
    """The version the binaries report (`stokerd --version`: `git describe` of the checkout
    at their build, in PEP 440's form, ipc/wire/build.rs), so the wheel has the very same.
    Builds them first (cargo is incremental: the wheel's own build step then finds them
    built)."""
    built = cargo_build()
    out = subprocess.run([str(built / "stokerd"), "--version"], capture_output=True, text=True,
                         check=True).stdout.split()
    if len(out) < 2 or out[0] != "stokerd":
        sys.exit(f"stoker: `stokerd --version` said {' '.join(out)!r}, not `stokerd VERSION`")
    return out[1]


class BuildPyWithBinaries(build_py):
    def run(self):
        super().run()
        built = cargo_build()
        for name, dest in ARTIFACTS:
            src = built / name
            out = Path(self.build_lib) / "stoker" / dest
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, out)
            sys.stderr.write(f"stoker: bundling {src}\n")


class BinaryDistribution(Distribution):
    """Native files inside: installed as platform-specific (platlib), never as pure Python."""

    def has_ext_modules(self):
        return True


class PlatformWheel(bdist_wheel):
    """Native binaries but no Python extension: `py3-none-<platform>`."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(version=binaries_version(),
      cmdclass={"build_py": BuildPyWithBinaries, "bdist_wheel": PlatformWheel},
      distclass=BinaryDistribution)
