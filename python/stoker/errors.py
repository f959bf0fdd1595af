"""Typed errors for libstoker's results (stoker.h `stoker_result`)."""


class StokerError(Exception):
    """Any failure reported by libstoker. `code` is the stoker_result value."""

    code = None

    def __init__(self, message, code=None):
        super().__init__(message)
        if code is not None:
            self.code = code


class InvalidArgument(StokerError, ValueError):
    """An argument libstoker refused (NULL, bad size, rank outside world_size, ...)."""

    code = -1


class ConnectError(StokerError, ConnectionError):
    """No daemon listens at the socket, or connecting failed."""

    code = -2


class ProtocolError(StokerError):
    """The daemon sent something this library does not understand."""

    code = -3


class SpecError(StokerError, ValueError):
    """The pipeline spec is invalid or differs from the job's (the message names the field)."""

    code = -4


class DaemonGone(StokerError, ConnectionError):
    """The daemon closed the connection or is stopping: attach again to resume."""

    code = -5


class DatasetError(StokerError):
    """The daemon does not know the dataset or cannot open it."""

    code = -6


class RefusedError(StokerError):
    """The daemon refused the attach (rank taken, quota, permission, device)."""

    code = -7


class StokerIOError(StokerError, OSError):
    """A system call failed (socket, mapping the ring)."""

    code = -8


class InternalError(StokerError):
    """A bug in the daemon or in libstoker."""

    code = -9


class DeviceError(StokerError):
    """The GPU asked for cannot be used: no CUDA driver, no such device, or the daemon's
    device ring cannot be imported on it (the message names the GPU and the reason)."""

    code = -10


class FieldError(StokerError):
    """One sample's field is not served: the sample has no member with that extension, it is
    over the spec's `field_max_bytes`, it could not be read, or it is not the text or JSON
    asked for. The message names the sample (its global index), the field and the reason;
    `sample`, `field` and `reason` ("missing", "too_large", "unreadable", "not_text",
    "not_json") say the same. Batches carry it in place of that sample's value, they do not
    raise it: other samples are unaffected."""

    code = -11

    def __init__(self, message, code=None, *, sample=None, field=None, reason=None):
        super().__init__(message, code)
        self.sample = sample
        self.field = field
        self.reason = reason


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        ConnectError,
        ProtocolError,
        SpecError,
        DaemonGone,
        DatasetError,
        RefusedError,
        StokerIOError,
        InternalError,
        DeviceError,
        FieldError,
    )
}


def error_for(code, message):
    cls = _BY_CODE.get(code)
    if cls is None:
        return StokerError(f"{message} (unknown result {code})", code)
    return cls(message)
