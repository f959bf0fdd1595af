"""A stand-in for stokerd that speaks the wire protocol (ipc/src/protocol.rs) with synthetic
batches, so the DLPack, lease and resume paths of the Python package are tested even where
the real daemon cannot be built. The real-daemon tests (test_daemon.py) check real pixels.

Batches are a pure function of (seed, epoch, step, rank): sample index
`(epoch * 7 + step * world_size * B + rank * B + i) % dataset_len`, label `index % classes`,
every pixel of sample i equal to `index + epoch / 1000`.

One connection at a time per listener thread; each attach gets its own sealed memfd ring.
"""

import fcntl
import json
import mmap
import os
import socket
import struct
import threading

MAGIC = b"SK"
VERSION = 1
ATTACH, ATTACHED, READY, RELEASE, DETACH, END_OF_DATA, ERROR = range(1, 8)
SLOT_ALIGN = 256
DTYPE_SIZE = {"u8": 1, "f16": 2, "bf16": 2, "f32": 4}


def align(n, a=SLOT_ALIGN):
    return (n + a - 1) // a * a


def message(kind, body=b""):
    return MAGIC + struct.pack("<HHH", VERSION, kind, 0) + body


class Layout:
    """ipc/src/ring.rs SlotLayout / RingLayout for host images: the image part (slots of
    image_slot_bytes) at the start of the memfd, then the host part (labels, indices, status;
    slots of host_slot_bytes) at host_offset."""

    def __init__(self, spec, slots):
        self.b = spec["batch_size"]
        h, w = spec["crop"]["size"]
        self.h, self.w = h, w
        self.image_bytes = h * w * 3 * DTYPE_SIZE[spec.get("dtype", "f32")]
        self.image_slot_bytes = align(self.b * self.image_bytes)
        self.labels = 0
        self.indices = align(self.labels + self.b * 8)
        self.status = align(self.indices + self.b * 8)
        self.host_slot_bytes = align(self.status + self.b)
        self.slot_bytes = self.image_slot_bytes + self.host_slot_bytes
        self.host_offset = self.image_slot_bytes * slots
        page = max(mmap.PAGESIZE, SLOT_ALIGN)
        self.slots = slots
        self.ring_bytes = (self.slot_bytes * slots + page - 1) // page * page


class FakeDaemon:
    def __init__(self, path, dataset_len=24, classes=3, slots=4):
        self.path = str(path)
        self.dataset_len, self.classes, self.slots = dataset_len, classes, slots
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(self.path)
        self.sock.listen(16)
        self.stopping = False
        self.conns = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def close(self):
        """Stops listening and hangs up on every client, like a daemon that died."""
        self.stopping = True
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _accept(self):
        while not self.stopping:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            self._serve_inner(conn)
        except (OSError, ValueError):
            pass
        finally:
            conn.close()

    def _serve_inner(self, conn):
        data = conn.recv(65536)
        assert data[:2] == MAGIC and struct.unpack("<H", data[4:6])[0] == ATTACH
        a = json.loads(data[8:])
        spec, rank, world = a["spec"], a["rank"], a["world_size"]
        layout = Layout(spec, self.slots)
        b = layout.b
        per_rank = -(-self.dataset_len // world)
        steps = -(-per_rank // b)
        epochs = spec.get("epochs")
        fd = os.memfd_create("fake-stoker", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, layout.ring_bytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        ring = mmap.mmap(fd, layout.ring_bytes)
        attached = {"slots": self.slots, "slot_bytes": layout.slot_bytes,
                    "ring_bytes": layout.ring_bytes, "steps_per_epoch": steps,
                    "dataset_len": self.dataset_len, "classes": self.classes,
                    "ranks_attached": 1, "created_job": True, "daemon_version": "fake"}
        socket.send_fds(conn, [message(ATTACHED, json.dumps(attached).encode())], [fd])
        os.close(fd)
        free = list(range(self.slots))
        generation = [0] * self.slots
        epoch, step = a["start"]["epoch"], a["start"]["step"]
        while True:
            while free and not (epochs is not None and epoch >= epochs):
                slot = free.pop(0)
                generation[slot] += 1
                self._fill(ring, layout, slot, epoch, step, rank, world)
                conn.send(message(READY, struct.pack("<IQQQI", slot, generation[slot], epoch,
                                                     step, b)))
                step += 1
                if step == steps:
                    epoch, step = epoch + 1, 0
            if epochs is not None and epoch >= epochs and len(free) == self.slots:
                conn.send(message(END_OF_DATA))
                epochs = -1  # sent once
            data = conn.recv(65536)
            if not data:
                return
            kind = struct.unpack("<H", data[4:6])[0]
            if kind == DETACH:
                return
            if kind == RELEASE:
                slot, gen = struct.unpack("<IQ", data[8:20])
                assert gen == generation[slot] and slot not in free, (slot, gen)
                free.append(slot)

    def _fill(self, ring, layout, slot, epoch, step, rank, world):
        import array

        images = slot * layout.image_slot_bytes
        base = layout.host_offset + slot * layout.host_slot_bytes
        b = layout.b
        pixels = layout.image_bytes // 4
        for i in range(b):
            index = (epoch * 7 + step * world * b + rank * b + i) % self.dataset_len
            img = array.array("f", [index + epoch / 1000]) * pixels
            off = images + i * layout.image_bytes
            ring[off:off + layout.image_bytes] = img.tobytes()
            struct.pack_into("<q", ring, base + layout.labels + 8 * i, index % self.classes)
            struct.pack_into("<Q", ring, base + layout.indices + 8 * i, index)
            ring[base + layout.status + i] = 0


def expected_indices(epoch, step, b, dataset_len=24, rank=0, world=1):
    return [(epoch * 7 + step * world * b + rank * b + i) % dataset_len for i in range(b)]
