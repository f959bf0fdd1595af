"""The installed wheel's version (issue 43 item 7): its METADATA says the version its binaries
report, from the same `git describe` (it was fixed at 0.1.0 whatever the binaries said)."""

import importlib.metadata
import subprocess

from stoker._daemon import bundled


def test_the_wheel_version_is_the_binaries():
    wheel = importlib.metadata.version("stoker")
    for name in ("stokerd", "stoker"):
        out = subprocess.run([str(bundled(name)), "--version"], capture_output=True, text=True,
                             check=True).stdout.split()
        assert out[1] == wheel, f"{name} --version says {out[1]}, the wheel {wheel}"
