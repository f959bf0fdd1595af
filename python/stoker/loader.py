"""`stoker.Loader`: a DataLoader-like iterable of (images, labels) served by stokerd."""

import itertools
import json
import os
import sys
from ctypes import byref, c_size_t, c_uint64, c_void_p, create_string_buffer

from . import _daemon, _lib, _reattach
from ._lib import STOKER_END_OF_DATA, call, lib
from .batch import Batch
from ._spec import (IMAGENET_MEAN, IMAGENET_STD, build_spec, field_modes, with_batch_transform,
                    with_transform, with_views)
from .errors import (ConnectError, DaemonGone, DatasetError, InvalidArgument, SpecError,
                     StokerError)

STATE_VERSION = 2
# Version 1 states ({epoch, step} at an unchanged world size) still load.
STATE_VERSIONS = (1, 2)


def _env_int(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _visible_gpus():
    """How many GPUs CUDA_VISIBLE_DEVICES leaves this process, or None when it is unset (all
    of them, a count only the driver knows). The driver stops at the first entry that is not
    a device; counting entries is enough to tell one visible GPU from LOCAL_RANK's."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None:
        return None
    return len([e for e in v.split(",") if e.strip()])


def _bare_cuda_ordinal():
    """The ordinal a bare "cuda" means: PyTorch's current device once PyTorch has set one up
    in this process; else LOCAL_RANK (torchrun's one GPU per process) when this process sees
    that many GPUs; else 0, as under Slurm or Kubernetes where each rank sees exactly its own
    GPU through CUDA_VISIBLE_DEVICES."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except (AttributeError, RuntimeError):
        pass
    local_rank = _env_int("LOCAL_RANK") or 0
    visible = _visible_gpus()
    return local_rank if visible is None or local_rank < visible else 0


def resolve_device(device):
    """What a Loader sends as its device: "cpu", "cuda:N", or a GPU UUID, from `device` as a
    user gives it ("cpu", "cuda", "cuda:N", a GPU UUID, a `torch.device`, None for "cpu").
    A bare "cuda" is PyTorch's current device, else "cuda:<LOCAL_RANK>" when this process sees
    that many GPUs, else "cuda:0" (see `_bare_cuda_ordinal`). Ordinals count the devices this
    process sees (its CUDA_VISIBLE_DEVICES); libstoker turns them into the GPU's UUID for the
    daemon."""
    if device is None:
        return "cpu"
    name = str(device).strip()
    if name == "cpu" or name.upper().startswith("GPU-"):
        return name
    if name == "cuda":
        return f"cuda:{_bare_cuda_ordinal()}"
    if name.startswith("cuda:") and name[5:].isdigit():
        return f"cuda:{int(name[5:])}"
    raise ValueError(f"device {device!r} is not 'cpu', 'cuda', 'cuda:N' or a GPU UUID "
                     "(GPU-xxxxxxxx-...)")


def _dataset_arg(dataset):
    """What the daemon is sent for `dataset`: a URL, or a registered name, as it is; a path
    made absolute, since the daemon cannot know this process's working folder. A name with a
    '/' (or a leading '.') is a path, registered names have none, so a relative path that does
    not exist goes absolute too and the daemon answers "not found" for it."""
    if "://" in dataset:
        return dataset
    if dataset.startswith("~"):
        dataset = os.path.expanduser(dataset)
    if os.path.exists(dataset) or "/" in dataset or dataset.startswith("."):
        return os.path.abspath(dataset)
    return dataset


def _check_found(dataset_arg):
    """Raises DatasetError("not found: PATH") for a dataset path that does not exist here, so
    that a typo fails where the Loader is made, not at the first batch. Only a path that
    certainly is not there (ENOENT, or a part of it is a file): one this process may not
    look into (EACCES) is for the daemon to judge, which reads with its own rights."""
    if "://" in dataset_arg or not os.path.isabs(dataset_arg):
        return
    try:
        os.stat(dataset_arg)
    except (FileNotFoundError, NotADirectoryError):
        raise DatasetError(f"not found: {dataset_arg}") from None
    except OSError:
        pass


def job_from_env():
    """The job key torchrun gives every rank alike, or None outside torchrun."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id and run_id != "none":
        return f"torchrun-{run_id}"
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port:
        return f"torchrun-{addr}:{port}"
    return None


class Loader:
    """Batches of one rank of a stoker job, as `(images, labels)` DLPack tensors.

    Iterating yields one epoch (`len(loader)` batches), as a DataLoader's: a new `for` starts
    the next epoch, also after a `for` the loop left mid-epoch (the rest is dropped;
    `dropped` says what). Continuing an epoch is `state_dict()` / `load_state_dict()`'s. `batches()` yields `Batch` objects (with `indices`, `status`,
    `epoch`, `step`) without stopping at epoch ends. See docs/python.md.

    Under torchrun, `rank`, `world_size` and `job` default to RANK, WORLD_SIZE and a key
    derived from TORCHELASTIC_RUN_ID (or MASTER_ADDR:MASTER_PORT); `local_rank` is LOCAL_RANK.

    `device="cuda"` (or "cuda:N") asks the daemon for the images in that GPU's memory: the
    images tensors are then CUDA tensors (DLPack kDLCUDA) viewing the ring, and a bare "cuda"
    is the GPU `resolve_device` says (PyTorch's current device, else LOCAL_RANK's when
    visible, else the first visible).

    Without `socket=` (or `$STOKER_SOCKET`) it uses the system daemon when one answers, else
    this user's own, which it starts when none answers (`autostart=False` turns that off).
    `stats()` is the data stall: time spent waiting in `next()` vs between calls.

    `train=True` (the default) is RandomResizedCrop(crop, scale, ratio), a horizontal flip with
    probability `flip_prob` (default 0.5) and a new sample order every epoch (`shuffle`,
    default True); `train=False` is Resize(resize, default crop*256/224) + CenterCrop(crop),
    no flip and dataset order (`flip_prob` and `shuffle` default to 0 and False).
    `exif_orientation=True` shows each JPEG as its EXIF orientation says (as Pillow's
    `ImageOps.exif_transpose`) before cropping; off by default (stored order).
    `fields=["txt", "json"]` (or `{"txt": "str", "json": "json"}`) serves those members of each
    WebDataset key beside the images: iterating then yields `(images, labels, fields)`, fields
    a dict of per-sample lists (bytes, str or parsed JSON; a `FieldError` in place of a sample's
    value that is missing, over `field_max_bytes` (default 4096) or unreadable).
    `views=[{"crop": 224, "scale": (0.4, 1)}, ..., {"crop": 96, "scale": (0.05, 0.4)}]` serves
    several views of each image, decoded once (docs/views.md): iterating then yields a list of
    image tensors, one per view, in place of `images`; each entry may say `crop`, `scale`,
    `ratio`, `flip_prob`, `resize`, `ops`, `erasing`, the Loader's arguments filling the rest.
    `transform=T.Compose([...])` (torchvision v2 or v1; docs/python.md, "Keep your torchvision
    code") gives the crop, flip, operations, dtype, normalisation and RandomErasing in
    torchvision's terms, in place of `crop`, `scale`, `ratio`, `resize`, `flip_prob`, `dtype`,
    `mean` and `std`; `views=[Compose, ...]` one per view; `batch_transform=T.MixUp(...)`
    (or CutMix, or `T.RandomChoice` of them) mixes each batch. Without torchvision, `ops=`,
    `erasing=` and `batch_mix=` take the spec's own dicts (docs/augment.md).
    With a batch mix, iterating yields `(images, soft_labels)`, soft_labels a float32
    `[batch, num_classes]` tensor; the integer labels stay on each `Batch` of `batches()`
    (`labels`, with `soft_labels` beside them).
    The arguments are checked here: a bad one raises SpecError naming it (a transform stoker
    cannot run is named, with the list of those it can).

    Once attached, the loader sticks to that daemon's socket: when the daemon goes away
    (restart, crash), it attaches again there at its own position, waiting up to
    `reconnect_timeout` seconds ($STOKER_RECONNECT_TIMEOUT, default 120) for it to come back,
    and the loop sees the batches an uninterrupted run would.
    """

    def __init__(self, dataset, batch_size=64, crop=224, *, train=True, resize=None,
                 scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip_prob=None, mean=IMAGENET_MEAN,
                 std=IMAGENET_STD, dtype="f32", layout="nchw", drop_last=False, epochs=None,
                 job=None, name=None, rank=None, world_size=None, seed=0, socket=None,
                 spec=None, device="cpu", autostart=True, reconnect_timeout=None,
                 shuffle=None, exif_orientation=False, fields=None, field_max_bytes=None,
                 views=None, transform=None, batch_transform=None, ops=None, erasing=None,
                 batch_mix=None):
        self.dataset = str(dataset)
        self._dataset_arg = _dataset_arg(self.dataset)
        _check_found(self._dataset_arg)
        if spec is None:
            spec = build_spec(batch_size, crop, train=train, resize=resize, scale=scale,
                              ratio=ratio, flip_prob=flip_prob, mean=mean, std=std, dtype=dtype,
                              layout=layout, drop_last=drop_last, epochs=epochs,
                              shuffle=shuffle, exif_orientation=exif_orientation,
                              fields=fields, field_max_bytes=field_max_bytes, ops=ops,
                              erasing=erasing)
            if transform is not None:
                if views is not None:
                    raise SpecError("Loader(transform=...) is one view's transform; with "
                                    "views=, give each view its own (views=[Compose, ...])")
                given = {"crop": (crop, 224), "resize": (resize, None),
                         "scale": (tuple(scale), (0.08, 1.0)),
                         "ratio": (tuple(ratio), (3 / 4, 4 / 3)),
                         "flip_prob": (flip_prob, None), "mean": (tuple(mean), IMAGENET_MEAN),
                         "std": (tuple(std), IMAGENET_STD), "dtype": (dtype, "f32")}
                clash = [f"{k}={v!r}" for k, (v, default) in given.items() if v != default]
                if clash:
                    raise SpecError("Loader(transform=...) gives the crop, flip, dtype and "
                                    "normalisation; leave out " + ", ".join(clash))
                spec = with_transform(spec, transform, ops=ops, erasing=erasing)
            if views is not None:
                spec = with_views(spec, views, train=train, scale=scale, ratio=ratio,
                                  flip_prob=flip_prob, resize=resize, ops=ops, erasing=erasing)
            if batch_transform is not None and batch_mix is not None:
                raise SpecError("Loader(batch_transform=...) and batch_mix= say the same: "
                                "pass one")
            if batch_transform is not None:
                spec = with_batch_transform(spec, batch_transform)
            elif batch_mix is not None:
                spec = with_batch_transform(spec, batch_mix, "batch_mix")
        elif views is not None:
            raise ValueError("views= builds the spec's views from the Loader's arguments; with "
                             "spec=, list them in the spec's extra_views instead")
        elif any(a is not None for a in (transform, batch_transform, ops, erasing, batch_mix)):
            raise ValueError("transform=, batch_transform=, ops=, erasing= and batch_mix= "
                             "build the spec from the Loader's arguments; with spec=, write "
                             "them in the spec (ops, erasing, batch_mix) instead")
        elif isinstance(spec, str):
            spec = json.loads(spec)
        self.spec = dict(spec)
        # Several views: iterating yields a list of image tensors in place of one.
        self._views = bool(self.spec.get("extra_views")) or views is not None
        # A batch mix: iterating yields the soft labels in place of the integer labels.
        self._mix = self.spec.get("batch_mix") is not None
        # (name, "bytes" | "str" | "json") per field the spec asks for, in its order.
        self._field_modes = (field_modes(fields) if fields is not None
                             else [(name, "bytes") for name in self.spec.get("fields", [])])
        self.rank = rank if rank is not None else (_env_int("RANK") or 0)
        self.world_size = world_size if world_size is not None else (_env_int("WORLD_SIZE") or 1)
        self.local_rank = _env_int("LOCAL_RANK") or 0
        if job is None:
            base = job_from_env()
            if base is not None:
                # Several loaders of one run (train, val) are separate jobs.
                job = f"{base}/{name or self.dataset}"
        if job is None and self.world_size > 1:
            raise ValueError("world_size > 1 needs a job key shared by every rank: pass job=... "
                             "or run under torchrun")
        self.job = job
        self.seed = int(seed)
        self.socket = str(socket) if socket is not None else None
        self.autostart = bool(autostart)
        self.reconnect_timeout = _reattach.reconnect_timeout(reconnect_timeout)
        # (socket, may start a daemon there) of the first attach: every later one goes there.
        self._home = None
        # Why the daemon went away, for the message of the wait that follows.
        self._gone = None
        # "cpu", "cuda:N" or a GPU UUID (see resolve_device).
        self.device = resolve_device(device)
        # The stall of connections closed earlier (a re-attach starts the client's from 0).
        self._stall_before = {"wait_s": 0.0, "compute_s": 0.0, "batches": 0, "bad_samples": 0}
        # Whether stderr was told of the skipped files, and of the first replaced sample
        # (once per Loader, whatever its attaches).
        self._told_skipped = False
        self._told_bad = False
        # The first bad samples' files, as the daemon last named them (kept across attaches).
        self._bad_names = []
        self._client = None
        self._info = None
        self._epoch = 0
        self._step = 0
        # The elastic offset (epoch, consumed) this loader resumed from, or None.
        self._offset = None
        self._ended = False
        # A batch received but not handed out yet (see _peek): what a KeyboardInterrupt while
        # next() waited leaves behind, delivered by the next call.
        self._held = None
        # True while a `for` has handed its loop a batch and not been asked for the next: a
        # `for` the loop leaves then (break, return, an exception in its body) left its epoch
        # unfinished, and the next `for` starts the next epoch (see __iter__).
        self._loop_holds = False
        # The rest of an epoch a new `for` dropped, {"epoch", "step", "batches"}, or None.
        self.dropped = None

    # --- connection --------------------------------------------------------------------

    def _attach(self):
        if self._client is not None:
            return
        if self._home is not None:
            # Attached before: the same daemon only, waiting for it while it restarts.
            socket, may_start = self._home
            gone, self._gone = self._gone, None
            _reattach.attach_again(self._attach_at, socket, may_start, self.reconnect_timeout,
                                   gone)
            return
        socket, may_start = _daemon.resolve(self.socket, self.autostart)
        self._first_attach(socket, may_start)
        self._home = (socket, may_start)

    def _first_attach(self, socket, may_start):
        if not may_start:
            return self._attach_at(socket)
        _daemon.ensure_daemon(socket)
        try:
            self._attach_at(socket)
        except (ConnectError, DaemonGone):
            # The daemon answered but was just leaving (its idle time ran out): start another.
            _daemon.ensure_daemon(socket)
            self._attach_at(socket)

    def _attach_at(self, socket):
        o = _lib.AttachOptions()
        call("stoker_attach_options_init", byref(o))
        # The ctypes struct holds char* into these bytes objects: keep them alive meanwhile.
        keep = {
            "socket": socket.encode(),
            "job": self.job.encode() if self.job else None,
            "dataset": self._dataset_arg.encode(),
            "spec_json": json.dumps(self.spec).encode(),
            "device": self.device.encode(),
        }
        for k, v in keep.items():
            setattr(o, k, v)
        o.rank = self.rank
        o.world_size = self.world_size
        o.seed = self.seed
        o.start_epoch = self._epoch
        o.start_step = self._step
        if self._offset is not None:
            o.offset_epoch, o.offset_consumed = self._offset
        client = c_void_p()
        call("stoker_attach", byref(o), byref(client))
        self._client = client
        self._info = _lib.read_info(_lib.AttachInfo, "stoker_client_info", client,
                                    self._drop_client)
        self._classes = self._class_names(client, self._info.classes)
        self._skipped = self._skipped_names(client, self._info.skipped)
        self._tell_skipped()
        # libstoker's idea of where the job starts (past a resumed epoch with nothing left).
        self._position_from_client()

    def _position_from_client(self):
        self._epoch, self._step = self._client_position()

    def _client_position(self):
        """The attached client's position: the batch after the last one it received."""
        epoch, step = c_uint64(), c_uint64()
        call("stoker_client_position", self._client, byref(epoch), byref(step))
        return epoch.value, step.value

    def close(self):
        """Detaches. Batches and arrays still held stay readable. Iterating attaches again,
        at `state_dict()`'s position, to the same daemon."""
        # A batch received but never handed out is the next batch of the position: attaching
        # again receives it anew.
        self._held = None
        self._drop_client()

    def _drop_client(self):
        """Detaches, keeping the stall figures measured so far."""
        if self._client:
            try:
                now = self._client_stall()
            except Exception:  # noqa: BLE001 - closing (maybe at interpreter exit) goes on
                now = dict.fromkeys(self._stall_before, 0)
            for key in self._stall_before:
                self._stall_before[key] += now[key]
            try:
                self._bad_sample_names()  # kept for stats() after the detach
            except Exception:  # noqa: BLE001 - as above
                pass
        client, self._client = self._client, None
        if client:
            lib.stoker_detach(client)

    def _client_stall(self):
        info = _lib.read_info(_lib.StallInfo, "stoker_client_stall", self._client)
        return {"wait_s": info.wait_s, "compute_s": info.compute_s, "batches": info.batches,
                "bad_samples": info.bad_samples}

    def _tell_skipped(self):
        """One line on stderr, once per Loader, when the dataset's index left files out."""
        count = self._info.skipped
        if self._told_skipped or count == 0:
            return
        self._told_skipped = True
        names = ", ".join(self._skipped)
        more = count - len(self._skipped)
        if more > 0:
            names += f" and {more} more"
        files = "file" if count == 1 else "files"
        print(f"stoker: {self._dataset_arg}: {count} {files} skipped (not a supported image "
              f"format): {names} (loader.info['skipped'])", file=sys.stderr, flush=True)

    def _tell_bad(self):
        """One line on stderr, once per Loader, at the first replaced sample."""
        if self._told_bad or self._client is None:
            return
        try:
            bad = self._stall_before["bad_samples"] + self._client_stall()["bad_samples"]
        except StokerError:
            return  # the daemon went away: the wait for the next batch says so
        if bad == 0:
            return
        self._told_bad = True
        samples = "sample" if bad == 1 else "samples"
        named = self._bad_sample_names()
        which = f": {', '.join(named)}" if named else ""
        print(f"stoker: {self._dataset_arg}: {bad} {samples} replaced by others (unreadable or "
              f"corrupt){which}; the daemon's log says why; loader.stats()['bad_samples'] "
              f"counts them and ['bad_sample_names'] names the first few", file=sys.stderr,
              flush=True)

    def _bad_sample_names(self):
        """The first few bad samples' files (paths below the dataset's root, in the order the
        daemon met them, for the whole job), as the daemon told the attached client before
        the batch that held each; the names of an earlier attach when it told none yet."""
        if self._client:
            try:
                named = self._told_names(self._client, "stoker_client_bad_sample_name")
            except StokerError:
                named = []
            if named:
                self._bad_names = named
        return list(self._bad_names)

    def stats(self):
        """The data stall since this loader was made: `wait_s` (time spent inside `next()`
        waiting for a batch), `compute_s` (time between calls: the training loop's own work),
        `wait_fraction` (wait / both) and `batches`; `bad_samples`, the samples of those
        batches the daemon replaced (unreadable or corrupt), and `bad_sample_names`, the
        first few of the job's bad files (paths below the dataset's root) as the daemon
        named them. The daemon shows the stall per
        rank (`stoker status`, metric `stoker_client_wait_fraction`)."""
        out = dict(self._stall_before)
        if self._client:
            for key, value in self._client_stall().items():
                out[key] += value
        total = out["wait_s"] + out["compute_s"]
        out["wait_fraction"] = out["wait_s"] / total if total > 0 else 0.0
        out["bad_sample_names"] = self._bad_sample_names()
        return out

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_client", None):
            self.close()

    # --- iteration ----------------------------------------------------------------------

    def next_batch(self):
        """The next `Batch`, or None once the job's epochs are done. A KeyboardInterrupt
        raised while this waits loses nothing: the batch that arrives meanwhile is the next
        call's, and `state_dict()` still names it."""
        if self._peek() is None:
            return None
        return self._take()

    def _peek(self):
        """The next batch, received but not handed out: it stays in `_held` (and the position
        before it) until `_take()`. The Batch exists before libstoker writes its lease, so an
        exception unwinding this at any point (Ctrl-C while `stoker_next` waits, raised when
        it returns) leaves the lease owned by `_held`, and the next call hands it out."""
        held = self._held
        if held is None or not held._handle:
            if self._ended:
                return None
            if not self._told_bad:
                # Here, not in _take: nothing is held or half handed out now.
                self._tell_bad()
            self._attach()
            held = self._held = Batch(self._field_modes)
            r = self._next_into(held)
            if r == STOKER_END_OF_DATA:
                self._held = None
                self._ended = True
                return None
        try:
            if held.epoch is None:
                held._read_header()
            if getattr(held, "_after", None) is None:
                # Nothing was received since `held`: the client's position is right after it.
                held._after = self._client_position()
        except Exception:
            self._held = None
            raise
        return held

    def _next_into(self, held):
        """`stoker_next` into `held`. When the daemon went away (after the batches it had
        already announced), attaches again at this loader's position, which is right after
        the last batch handed out (nothing is held then), and asks again."""
        while True:
            try:
                return call("stoker_next", self._client, byref(held._handle))
            except DaemonGone as gone:
                self._gone = str(gone)
                self._drop_client()
                self._attach()

    def _take(self):
        """Hands out the batch `_peek` returned and moves the position past it. No call in
        here: Python raises a pending KeyboardInterrupt only at calls and loops, so the batch
        is either still held or handed out, never lost."""
        held, self._held = self._held, None
        self._epoch, self._step = held._after
        return held

    def _steps_in(self, epoch):
        """Batches of `epoch` for this rank (fewer in an elastic resume's epoch), as the
        attached client says."""
        steps = c_uint64()
        call("stoker_client_steps_in", self._client, epoch, byref(steps))
        return steps.value

    def batches(self):
        """Yields `Batch` objects until the job's epochs are done (forever if unbounded)."""
        while True:
            b = self.next_batch()
            if b is None:
                return
            yield b

    def __iter__(self):
        """Yields `(images, labels)` for the rest of the current epoch (`(images, soft_labels)`
        with a batch mix). As a DataLoader's, a
        new `for` after one the loop left mid-epoch (break, return, an exception in its body)
        starts the next epoch: the rest of the left one is dropped (`dropped` says what).
        The first `for`, one after `load_state_dict()`, and one after a KeyboardInterrupt that
        came while the loader waited for a batch go on from the position."""
        if self._loop_holds:
            self._loop_holds = False
            self._drop_rest_of_epoch()
        epoch = self._epoch
        while self._epoch == epoch:
            b = self._peek()
            if b is None:
                return
            # Made before the batch is handed out: an interrupt in here leaves it held.
            images = b.views if self._views else b.images
            labels = b.soft_labels if self._mix else b.labels
            item = (images, labels, b.fields) if self._field_modes else (images, labels)
            del b
            self._take()
            self._loop_holds = True
            yield item
            self._loop_holds = False
            # The caller has its own reference; waiting for the next batch, this keeps none.
            del item

    def _drop_rest_of_epoch(self):
        """Moves the position to the next epoch's first batch when it is inside an epoch,
        attaching again there (the daemon stops making the dropped batches)."""
        if self._step == 0 or self._ended:
            return
        if self._client is None:
            self._attach()
        rest = self._steps_in(self._epoch) - self._step
        self.dropped = {"epoch": self._epoch, "step": self._step, "batches": rest}
        self.close()
        self._epoch, self._step = self._epoch + 1, 0

    def __len__(self):
        """Batches of the current epoch for this rank (attaches if needed); fewer than usual
        in the epoch an elastic resume continues."""
        self._attach()
        return self._steps_in(self._epoch)

    @staticmethod
    def _class_names(client, count):
        """The dataset's class names in label order, as libstoker has them; the labels as
        strings where the daemon sent none (no names in the dataset, or too many to send)."""
        names, length = [], c_size_t()
        for i in range(count):
            try:
                call("stoker_client_class_name", client, i, None, 0, byref(length))
            except InvalidArgument:
                return [str(label) for label in range(count)]
            buf = create_string_buffer(length.value + 1)
            call("stoker_client_class_name", client, i, buf, len(buf), byref(length))
            names.append(buf.value.decode("utf-8", "replace"))
        return names

    @staticmethod
    def _skipped_names(client, count):
        """The first few skipped files' names, as the daemon sent them."""
        return Loader._told_names(client, "stoker_client_skipped_name", count)

    @staticmethod
    def _told_names(client, function, count=None):
        """Names `function` (`stoker_client_skipped_name`, `stoker_client_bad_sample_name`)
        copies out, from index 0 until it says there are no more (or `count` of them)."""
        names, length = [], c_size_t()
        for i in range(count) if count is not None else itertools.count():
            try:
                call(function, client, i, None, 0, byref(length))
            except InvalidArgument:
                break
            buf = create_string_buffer(length.value + 1)
            call(function, client, i, buf, len(buf), byref(length))
            names.append(buf.value.decode("utf-8", "replace"))
        return names

    @property
    def info(self):
        """What the daemon said at attach: slots, steps_per_epoch, dataset_len, ... and the
        classes as torchvision's ImageFolder names them: `classes` (names in label order: an
        ImageFolder's class folders; the labels as strings for a dataset without names) and
        `class_to_idx`; `num_classes` is their number."""
        self._attach()
        info = {name: getattr(self._info, name) for name, _ in self._info._fields_
                if name not in ("size", "classes", "skipped")}
        info["skipped"] = {"count": self._info.skipped, "first": list(self._skipped)}
        info["num_classes"] = self._info.classes
        info["classes"] = list(self._classes)
        info["class_to_idx"] = {name: i for i, name in enumerate(self._classes)}
        return info

    @property
    def epoch(self):
        """The epoch of the next batch."""
        return self._epoch

    # --- resume -------------------------------------------------------------------------

    def _consumed(self):
        """Samples of the current epoch's permutation all ranks consumed before the next
        batch (exact: padding and drop_last only touch an epoch's last step)."""
        offset_epoch, offset_consumed = self._offset if self._offset is not None else (0, 0)
        consumed = c_uint64()
        call("stoker_position_consumed", self._epoch, self._step, offset_epoch, offset_consumed,
             self.world_size, int(self.spec["batch_size"]), byref(consumed))
        return consumed.value

    def state_dict(self):
        """Where to resume, at this or another world size: the (epoch, step) of the next batch,
        the same place as samples of the epoch consumed by every rank together, and what must
        not change. See docs/multi-host.md ("Elastic state")."""
        offset = None
        if self._offset is not None:
            offset = {"epoch": self._offset[0], "consumed": self._offset[1]}
        return {"version": STATE_VERSION, "epoch": self._epoch, "step": self._step,
                "consumed": self._consumed(), "offset": offset,
                "batch_size": int(self.spec["batch_size"]), "seed": self.seed,
                "dataset": self.dataset, "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state):
        """Resumes at `state`'s position: the next batch is the one after the last one the
        saving loader yielded. At another world size or batch size (an elastic restart), the
        rest of the saved epoch is split over this loader's ranks, each sample of it once, and
        later epochs follow the usual partition. Detaches if attached."""
        version = state.get("version")
        if version not in STATE_VERSIONS:
            raise ValueError(f"state version {version!r}, expected one of {STATE_VERSIONS}")
        keys = ("seed", "dataset", "world_size") if version == 1 else ("seed", "dataset")
        for key in keys:
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"state is for {key}={state[key]!r}, this loader has "
                                 f"{getattr(self, key)!r}")
        self.close()
        self._ended = False
        # An explicit position: the next `for` goes on from it, whatever the last one did.
        self._loop_holds = False
        epoch, step = int(state["epoch"]), int(state["step"])
        same_shape = version == 1 or (state["world_size"] == self.world_size
                                      and state["batch_size"] == int(self.spec["batch_size"]))
        if same_shape:
            offset = state.get("offset")
            self._epoch, self._step = epoch, step
            self._offset = (int(offset["epoch"]), int(offset["consumed"])) if offset else None
        else:
            consumed = int(state["consumed"])
            self._epoch, self._step = epoch, 0
            self._offset = (epoch, consumed) if consumed > 0 else None
