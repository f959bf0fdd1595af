"""Batch mixes (MixUp / CutMix, docs/augment.md "Batch mixes") through the Python client
against a real stokerd: `Loader(batch_mix={...})` yields `(images, soft_labels)`, soft_labels
a float32 [batch, num_classes] DLPack tensor whose rows sum to 1 and put their weight on the
batch's own and rolled integer labels (still on each Batch); torch takes both tensors; a bad
batch_mix is refused at the Loader."""

import random

import numpy as np
import pytest

import stoker

CLASSES = 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An ImageFolder of 3 classes of 4 JPEGs, 20 to 30 pixels a side."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("mix") / "images"
    rng = random.Random(7)
    for c in range(CLASSES):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(4):
            w, h = rng.randint(20, 30), rng.randint(20, 30)
            Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3)).save(
                root / f"c{c}" / f"{i:03}.jpg", quality=90)
    return root


def loader(root, daemon, job, **kw):
    return stoker.Loader(root, batch_size=4, crop=16, epochs=1, seed=5, job=job,
                         socket=daemon, autostart=False, **kw)


MIXUP = {"kind": "mix_up", "alpha": 0.5, "num_classes": CLASSES}
CUTMIX = {"kind": "cut_mix", "alpha": 1.0, "num_classes": CLASSES}


def test_loader_yields_soft_labels_of_batch_by_num_classes(folder, daemon):
    mix = {"kind": "choice", "mixes": [MIXUP, CUTMIX], "p": [0.5, 0.5]}
    with loader(folder, daemon, "py-mix", batch_mix=mix) as ld:
        seen = 0
        for images, soft in ld:
            assert soft.dtype == "float32"
            assert soft.shape == (4, CLASSES)
            y = np.from_dlpack(soft)
            assert y.shape == (4, CLASSES)
            np.testing.assert_allclose(y.sum(axis=1), 1.0, atol=1e-6)
            assert np.from_dlpack(images).shape == (4, 3, 16, 16)
            seen += 1
        assert seen == 3
    # The integer labels stay on the Batch, and the soft rows weigh them and the rolled ones.
    with loader(folder, daemon, "py-mix-batches", batch_mix=MIXUP) as ld:
        for b in ld.batches():
            labels = np.from_dlpack(b.labels)
            y = np.from_dlpack(b.soft_labels)
            assert b.num_classes == CLASSES
            for i in range(b.n):
                prev = labels[(i - 1) % b.n]
                support = {int(labels[i]), int(prev)}
                assert {int(c) for c in np.nonzero(y[i])[0]} <= support


def test_torch_takes_the_soft_labels(folder, daemon):
    torch = pytest.importorskip("torch")
    with loader(folder, daemon, "py-mix-torch", batch_mix=CUTMIX) as ld:
        images, soft = next(iter(ld))
        x, y = torch.from_dlpack(images), torch.from_dlpack(soft)
        assert y.dtype == torch.float32 and tuple(y.shape) == (4, CLASSES)
        loss = torch.nn.functional.cross_entropy(torch.zeros(4, CLASSES), y)
        assert torch.isfinite(loss)
        assert x.shape == (4, 3, 16, 16)


def test_without_a_mix_there_are_no_soft_labels(folder, daemon):
    with loader(folder, daemon, "py-no-mix") as ld:
        b = next(ld.batches())
        assert b.soft_labels is None and b.num_classes == 0


def test_bad_batch_mix_is_refused_by_name(folder, daemon):
    with pytest.raises(stoker.SpecError, match="batch_mix"):
        loader(folder, daemon, "py-bad", batch_mix=[1, 2])
    with pytest.raises(Exception, match="alpha must be positive"):
        with loader(folder, daemon, "py-bad-alpha",
                    batch_mix={"kind": "mix_up", "alpha": 0, "num_classes": 3}) as ld:
            next(iter(ld))
