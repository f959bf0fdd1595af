"""Against a real stokerd: STOKER_SOCKET, STOKER_TEST_DATA (an ImageFolder of
STOKER_TEST_SAMPLES images) and STOKER_LIB are set by tests/python.rs. Run:
    python3 -m unittest discover -s python/tests
"""

import ctypes
import os
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import stoker  # noqa: E402
from stoker import _lib  # noqa: E402

SOCKET = os.environ.get("STOKER_SOCKET")
DATA = os.environ.get("STOKER_TEST_DATA")
SAMPLES = int(os.environ.get("STOKER_TEST_SAMPLES", "0"))
SPEC = {
    "batch_size": 4,
    "crop": {"kind": "center_crop", "resize": 16, "size": [16, 16]},
    "dtype": "u8",
    "epochs": 2,
}


_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def capsule_tensor(capsule):
    ptr = _get_pointer(capsule, b"dltensor_versioned")
    return ctypes.cast(ptr, ctypes.POINTER(_lib.DLManagedTensorVersioned)).contents


@unittest.skipUnless(SOCKET and DATA, "needs a daemon (run through tests/python.rs)")
class LoaderTest(unittest.TestCase):
    def loader(self, job, **kw):
        return stoker.Loader(DATA, SPEC, job=job, socket=SOCKET, rank=0, world_size=1, **kw)

    def test_an_epoch_per_iteration_covering_every_sample(self):
        loader = self.loader("py-epochs")
        self.assertEqual(len(loader), (SAMPLES + 3) // 4)
        for epoch in range(2):
            seen = []
            for batch in loader.batches():
                self.assertEqual(batch.epoch, epoch)
                seen += batch.indices.tolist()
                self.assertEqual(batch.status.tolist(), [0] * batch.n)
            self.assertEqual(sorted(seen), list(range(SAMPLES)))
        self.assertEqual(list(loader.batches()), [])
        loader.close()

    def test_dlpack_views_the_ring_without_copying(self):
        loader = self.loader("py-dlpack")
        images, labels = next(iter(loader))
        self.assertEqual(images.__dlpack_device__(), (1, 0))
        cap = images.__dlpack__(max_version=(1, 0))
        t = capsule_tensor(cap)
        self.assertEqual((t.version.major, t.dl_tensor.ndim), (1, 4))
        self.assertEqual([t.dl_tensor.shape[i] for i in range(4)], [4, 3, 16, 16])
        self.assertEqual(t.dl_tensor.data, images.data_ptr(), "a view of the ring, not a copy")
        lab = capsule_tensor(labels.__dlpack__(max_version=(1, 0)))
        self.assertEqual(lab.dl_tensor.dtype.code, 0)  # kDLInt
        self.assertEqual(lab.dl_tensor.dtype.bits, 64)
        with self.assertRaises(BufferError):
            images.__dlpack__()  # unversioned consumers are refused, not misled
        del cap  # unconsumed: the capsule's destructor frees the tensor
        loader.close()

    def test_state_dict_resumes_at_the_next_batch(self):
        first = self.loader("py-resume-a")
        it = first.batches()
        for _ in range(2):
            next(it)
        state = first.state_dict()
        self.assertEqual(state, {"epoch": 0, "step": 2})
        expected = [b.indices.tolist() for b in it]
        first.close()
        second = self.loader("py-resume-b")
        second.load_state_dict(state)
        got = [b.indices.tolist() for b in second.batches()]
        self.assertEqual(got, expected)
        second.close()

    def test_rank_and_world_size_come_from_the_environment(self):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = "1", "2"
        try:
            loader = stoker.Loader(DATA, SPEC, job="py-env", socket=SOCKET)
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        self.assertEqual((loader.rank, loader.world_size), (1, 2))


class NoDaemonTest(unittest.TestCase):
    def test_no_daemon_raises_a_typed_error(self):
        loader = stoker.Loader("/nowhere", SPEC, socket="/nonexistent/stoker.sock", job="x")
        with self.assertRaises(stoker.NoDaemonError) as cm:
            len(loader)
        self.assertIn("no stoker daemon at /nonexistent/stoker.sock", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
