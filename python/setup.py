"""Copies libstoker.so from the Cargo target directory into the package at build time.

`pip install ./python` after `cargo build --release -p stoker-ipc` (or any cargo build of the
workspace). The library is looked up, in order, at `$STOKER_LIB`, then in
`$CARGO_TARGET_DIR/{release,debug}`, then in `<repo>/target/{release,debug}`. When none is
found the package installs without it and `import stoker` searches again at run time (see
stoker/_lib.py), failing with a message that says what to build.
"""

import os
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = Path(__file__).resolve().parent
LIB = "libstoker.so"


def find_library():
    env = os.environ.get("STOKER_LIB")
    if env:
        return Path(env)
    dirs = []
    if os.environ.get("CARGO_TARGET_DIR"):
        dirs.append(Path(os.environ["CARGO_TARGET_DIR"]))
    dirs.append(HERE.parent / "target")
    for d in dirs:
        for profile in ("release", "debug"):
            if (d / profile / LIB).is_file():
                return d / profile / LIB
    return None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = find_library()
        if lib is None or not lib.is_file():
            sys.stderr.write(
                "stoker: WARNING: libstoker.so not found (run `cargo build --release` first, "
                "or set STOKER_LIB); installing without it, `import stoker` will search for it "
                "at run time\n"
            )
            return
        dest = Path(self.build_lib) / "stoker" / LIB
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
        sys.stderr.write(f"stoker: bundling {lib}\n")


class BinaryDistribution(Distribution):
    """The wheel carries a native library: tag it for this platform, not `any`."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
