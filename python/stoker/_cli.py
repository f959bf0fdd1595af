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
    # `stoker bench --compare` runs the peer scripts shipped in this package, with this
    # Python (where the user installed torch, torchvision or DALI), unless told otherwise.
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ.setdefault("STOKER_PEERS", os.path.join(here, "peers"))
    os.environ.setdefault("STOKER_PEER_PYTHON", sys.executable)
    _exec("stoker")


def stokerd():
    _exec("stokerd")
