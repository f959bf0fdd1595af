"""Which daemon a Loader talks to, and starting this user's own when none answers.

`socket=` is used as given; without it libstoker resolves the socket by the one rule
(docs/operations.md, "Which socket": `$STOKER_SOCKET`, else the system daemon when one answers
or when its socket exists but refuses this user, else this user's own socket). Only at this
user's own socket is a daemon started from the stokerd bundled in this package when none
answers (unless `autostart=False`): a refusing system socket makes the attach fail with
libstoker's reason (which socket, its group, this user's groups), never a private daemon,
unless `STOKER_PRIVATE_DAEMON=1` asks for one.

Starting happens under an exclusive `flock` on `stoker.lock` in that folder: of the ranks that
find no daemon at once, the first starts it and the others, woken when the lock is released,
find it answering. `stokerd --detach` returns once the daemon serves (or with its exit code if
it failed), so nothing here polls. The daemon runs in its own session, logs to `stokerd.log`
in the same folder, and exits after `$STOKER_IDLE_EXIT` seconds (default 600) without clients.
"""

import ctypes
import fcntl
import os
import shlex
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

from ._lib import call
from .errors import ConnectError

# `stoker_socket_path_resolve`'s source for this user's own socket (0 $STOKER_SOCKET, 1 the
# system daemon's, 3 the system daemon's refusing this user: nothing is started at those).
USER_SOCKET = 2
LOCK_NAME = "stoker.lock"
LOG_NAME = "stokerd.log"
# Seconds without any client after which the daemon started here exits.
DEFAULT_IDLE_EXIT = 600
# How long `stokerd --detach` may take to bind its socket (it does not index anything yet).
START_TIMEOUT = 60
# How much of the log a failed start shows.
LOG_TAIL_BYTES = 2000


def bundled(name):
    """The path of a binary shipped in this package (`stokerd` or `stoker`)."""
    return Path(__file__).resolve().parent / "bin" / name


def answers(path):
    """True when a daemon accepts a connection at `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(5)
        s.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        s.close()


def resolve(socket_arg, autostart):
    """`(socket path, whether a daemon may be started there)`: `socket_arg` as given, else
    libstoker's resolution (`stoker_socket_path_resolve`)."""
    if socket_arg:
        return str(socket_arg), False
    path, source = ctypes.c_char_p(), ctypes.c_int32()
    call("stoker_socket_path_resolve", ctypes.byref(path), ctypes.byref(source))
    return path.value.decode(), bool(autostart) and source.value == USER_SOCKET


def private_dir(path):
    """Creates `path` mode 0700 if missing; refuses one that another user could write to
    (they could put their own daemon's socket there)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConnectError(f"cannot create the daemon folder {path}: {e.strerror}") from e
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise ConnectError(f"daemon folder {path} is not a directory (a symlink or file): "
                           "refusing to use it")
    if st.st_uid != os.getuid():
        raise ConnectError(f"daemon folder {path} belongs to uid {st.st_uid}, not to this user "
                           f"(uid {os.getuid()}): refusing to use it")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)
    return Path(path)


def ensure_daemon(sock):
    """Makes sure a daemon answers at `sock` (this user's own socket), starting one if none
    does. Returns True when this call started it."""
    if answers(sock):
        warn_if_args_differ(sock)
        return False
    folder = private_dir(Path(sock).parent)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # Blocks while another process starts the daemon; it releases the lock once the
        # daemon serves (or failed).
        fcntl.flock(fd, fcntl.LOCK_EX)
        if answers(sock):
            warn_if_args_differ(sock)
            return False
        _start(sock, folder)
        return True
    finally:
        os.close(fd)


def _peer_pid(path):
    """The pid of the process serving the socket at `path` (SO_PEERCRED), or None."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        s.settimeout(5)
        s.connect(str(path))
        pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     struct.calcsize("3i")))
        return pid
    except OSError:
        return None
    finally:
        s.close()


def _running_args(pid):
    """The flags the daemon `pid` was started with beyond the ones a Loader always passes
    (what came from STOKER_DAEMON_ARGS when a Loader started it), or None if unreadable."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    except OSError:
        return None
    argv = [a.decode("utf-8", "replace") for a in argv]
    if "--idle-exit" in argv:
        return argv[argv.index("--idle-exit") + 2:]
    return argv[1:]


def warn_if_args_differ(sock):
    """A daemon already serves at this user's socket: when STOKER_DAEMON_ARGS asks for other
    flags than it was started with, says so on stderr (they apply only to a daemon a Loader
    starts). Unset, nothing is asked and nothing compared."""
    asked = os.environ.get("STOKER_DAEMON_ARGS")
    if asked is None:
        return
    pid = _peer_pid(sock)
    running = _running_args(pid) if pid else None
    if running is None or running == shlex.split(asked):
        return
    sys.stderr.write(f"stoker: STOKER_DAEMON_ARGS asks for `{asked}` but the daemon already "
                     f"running at {sock} (pid {pid}) was started with `{shlex.join(running)}`; "
                     f"it keeps its flags until it exits: `stoker stop` stops it, and the next "
                     f"Loader starts one with the flags asked\n")


def idle_exit():
    value = os.environ.get("STOKER_IDLE_EXIT", "")
    try:
        return int(value) if value else DEFAULT_IDLE_EXIT
    except ValueError:
        raise ValueError(f"STOKER_IDLE_EXIT={value!r} is not a whole number of seconds") from None


def _start(sock, folder):
    stokerd = bundled("stokerd")
    if not os.access(stokerd, os.X_OK):
        raise ConnectError(f"no daemon answers at {sock} and this package has no stokerd to "
                           f"start ({stokerd} is missing): reinstall stoker")
    idle = idle_exit()
    cmd = [str(stokerd), "--detach", "--socket", str(sock), "--socket-mode", "600",
           "--idle-exit", str(idle)]
    cmd += shlex.split(os.environ.get("STOKER_DAEMON_ARGS", ""))
    log = folder / LOG_NAME
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "ab") as out:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        out.write(f"--- {stamp} started by pid {os.getpid()}: {shlex.join(cmd)}\n".encode())
        out.flush()
        start = log.stat().st_size
        try:
            rc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/",
                                timeout=START_TIMEOUT, close_fds=True).returncode
        except subprocess.TimeoutExpired:
            rc = None
    if rc != 0:
        with open(log, "rb") as f:
            f.seek(max(start, log.stat().st_size - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace").strip()
        why = f"did not serve within {START_TIMEOUT} s" if rc is None else f"exited with {rc}"
        raise ConnectError(f"no daemon answered at {sock}, and the stokerd started for this "
                           f"user {why}; its log {log} ends with:\n{tail}")
    sys.stderr.write(f"stoker: started stokerd for this user at {sock} (it exits after {idle} s "
                     f"without clients); its log: {log}\n")
