"""Attaching a Loader again to the daemon it was attached to: after the daemon went away (a
restart by systemd, a Kubernetes rolling update, a crash) or after `close()`.

Design
- A Loader keeps the socket of its first attach for its whole life: it never switches to
  another daemon mid-job (a leftover per-user one, say, while the system daemon restarts),
  whose jobs, limits and owner are not the ones this job started with.
- The Loader attaches at its own position (the batch after the last one it handed out), so
  the loop sees exactly the batches an uninterrupted run would: every batch is a pure function
  of (seed, epoch, index), and no daemon state has to survive.
- While no daemon serves at that socket, this waits for one, for at most the Loader's
  `reconnect_timeout` (`$STOKER_RECONNECT_TIMEOUT`, else `DEFAULT_RECONNECT_TIMEOUT`), trying
  again after 50 ms, doubling up to 1 s. "Not back yet" is: nothing listens there (or the
  daemon started for this user cannot be started yet), a daemon still draining that refuses
  with "daemon stopping", or one that goes away during the attach. Any other refusal (a spec
  mismatch, permission) is raised at once. The wait is logged on stderr, once when it starts
  and once when it ends.

Limitations
- An attempt that finds the socket answering connects and waits for the daemon's answer: a
  socket held open by systemd (socket activation) answers while the daemon restarts, so the
  wait then lasts until the daemon serves, as systemd's own start timeout bounds it.
"""

import os
import sys
import time

from . import _daemon
from .errors import ConnectError, DaemonGone

# Seconds a Loader waits for its daemon to come back: a systemd restart (drain up to 10 s, then
# start) or a rolling update of a DaemonSet pod fits, a daemon that is gone for good does not.
DEFAULT_RECONNECT_TIMEOUT = 120.0
RECONNECT_TIMEOUT_ENV = "STOKER_RECONNECT_TIMEOUT"
FIRST_PAUSE = 0.05
MAX_PAUSE = 1.0


def reconnect_timeout(value=None):
    """`value` seconds, else `$STOKER_RECONNECT_TIMEOUT`, else DEFAULT_RECONNECT_TIMEOUT."""
    source = "reconnect_timeout"
    if value is None:
        value = os.environ.get(RECONNECT_TIMEOUT_ENV) or DEFAULT_RECONNECT_TIMEOUT
        source = RECONNECT_TIMEOUT_ENV
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"{source}={value!r} is not a number of seconds") from None
    if not seconds >= 0 or seconds == float("inf"):
        raise ValueError(f"{source}={value!r} is not a finite number of seconds >= 0")
    return seconds


def attach_again(attach, socket, may_start, timeout, gone=None):
    """Calls `attach(socket)` until it succeeds, waiting for a daemon at `socket` (starting
    this user's own there when `may_start`) for at most `timeout` seconds; then raises
    `DaemonGone` naming the socket and the wait. `gone` is why the daemon went away (the
    error that said so), None after a `close()`."""
    start = time.monotonic()
    pause, last, waiting = FIRST_PAUSE, None, False
    while True:
        try:
            if may_start:
                _daemon.ensure_daemon(socket)
            if may_start or _daemon.answers(socket):
                attach(socket)
                if waiting or gone is not None:
                    sys.stderr.write(f"stoker: re-attached to the daemon at {socket} after "
                                     f"{time.monotonic() - start:.1f} s\n")
                return
            last = "nothing listens there"
        except (ConnectError, DaemonGone) as e:
            last = str(e)
        left = start + timeout - time.monotonic()
        if left <= 0:
            why = f" ({gone})" if gone is not None else ""
            raise DaemonGone(
                f"the daemon at {socket} went away{why} and did not come back within "
                f"{timeout:g} s (Loader(reconnect_timeout=...) or ${RECONNECT_TIMEOUT_ENV} "
                f"sets the wait); last attempt: {last}")
        if not waiting:
            waiting = True
            why = f" ({gone})" if gone is not None else ""
            sys.stderr.write(f"stoker: the daemon at {socket} is gone{why}; waiting up to "
                             f"{timeout:g} s for it to come back\n")
        time.sleep(min(pause, left))
        pause = min(pause * 2, MAX_PAUSE)
