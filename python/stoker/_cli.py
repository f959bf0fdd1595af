"""Console entry points `stoker` and `stokerd`: run the binaries bundled in this package."""

import os
import sys

from ._daemon import bundled


def _exec(name):
    path = bundled(name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: {path} is missing from the installed stoker package; "
                         "reinstall it\n")
        sys.exit(127)
    os.execv(path, [name, *sys.argv[1:]])


def stoker():
    _exec("stoker")


def stokerd():
    _exec("stokerd")
