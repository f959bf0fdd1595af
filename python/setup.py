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
reuse the debug build), `CARGO` (the cargo to run), `CARGO_TARGET_DIR`, `STOKER_LINKER`
(python/build-wheel sets it: a linker that links against an older glibc, below).

An older glibc: the binaries built here use the symbol versions of this machine's glibc
(2.34 on Debian 12), too new for RHEL/Rocky 8 (2.28). With `STOKER_LINKER` set
(python/build-wheel sets it to cargo-zigbuild's `zig cc` for x86_64-linux-gnu.2.28), the three
artifacts are linked once more with it after the build: `cargo rustc` compiles and links only
their own crates again (the thin `stokerd` and `stoker` mains and the libstoker cdylib), and
every library they link stays the one the build made. The glibc a binary needs is decided at
the link (its symbol versions come from the libc it is linked against), so this gives the
manylinux_2_28 binaries without a second build of the dependencies for another target folder
(`cargo zigbuild --target x86_64-unknown-linux-gnu.2.28` would build everything again, minutes
on a 2-core CI machine; docs/decisions.md has the measurements). The relinked files replace
the build's own in the target folder (the next plain `cargo build` relinks those crates as
before, a minute or less).
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


def cargo_build(linker=None):
    """Builds the three artifacts, and links them again with `linker` if given; returns the
    folder they are in."""
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
    if linker:
        relink(cargo, profile, linker)
    target = Path(os.environ.get("CARGO_TARGET_DIR") or REPO / "target")
    if not target.is_absolute():
        target = REPO / target
    return target / ("debug" if profile == "dev" else profile)


def relink(cargo, profile, linker):
    """Links the three artifacts again with `linker` (see the module's docs). The library
    last: building the two programs may rebuild its rlib (and with it the cdylib, linked the
    usual way) when an earlier relink left the rlib's fingerprint stale."""
    if not Path(linker).is_file():
        sys.exit(f"stoker: STOKER_LINKER={linker}: no such file")
    sys.stderr.write(f"stoker: linking the binaries again with {linker}\n")
    for target in (["-p", "stoker-tool", "--bin", "stoker"],
                   ["-p", "stoker-daemon", "--bin", "stokerd"],
                   ["-p", "stoker-client", "--lib", "--crate-type", "cdylib"]):
        cmd = [cargo, "rustc", "--locked", "--profile", profile, *target, "--",
               "-C", f"linker={linker}"]
        sys.stderr.write(f"stoker: {' '.join(cmd)}\n")
        subprocess.run(cmd, cwd=REPO, check=True)


def binaries_version():
    """The version the binaries report (`stokerd --version`: `git describe` of the checkout
    at their build, in PEP 440's form, ipc/wire/build.rs), so the wheel has the very same.
    Builds them first (cargo is incremental: the wheel's own build step then finds them
    built); the version does not depend on the linker, so they are not relinked here."""
    built = cargo_build()
    out = subprocess.run([str(built / "stokerd"), "--version"], capture_output=True, text=True,
                         check=True).stdout.split()
    if len(out) < 2 or out[0] != "stokerd":
        sys.exit(f"stoker: `stokerd --version` said {' '.join(out)!r}, not `stokerd VERSION`")
    return out[1]


class BuildPyWithBinaries(build_py):
    def run(self):
        super().run()
        built = cargo_build(os.environ.get("STOKER_LINKER"))
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
