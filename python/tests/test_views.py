"""Several views of one image (docs/views.md) through the Python client against a real stokerd
(CPU backend): `Loader(views=[...])` with DINO's 2 global + 6 local views yields a list of 8
tensors per batch at their own sizes; view 0 is, byte for byte, what a one-view Loader of the
same crop serves; a second run and a resume serve the same bytes; bad views are refused at the
Loader, naming the entry."""

import random
import re

import numpy as np
import pytest

import stoker

GLOBAL, LOCAL, SEED = 32, 16, 3
VIEWS = [{"crop": GLOBAL, "scale": (0.4, 1.0)}] * 2 + [{"crop": LOCAL, "scale": (0.05, 0.4)}] * 6


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """An ImageFolder of 10 JPEGs of 20 to 30 pixels a side: no view's box is twice its output
    size, so a one-view job decodes at full scale too and its pixels must agree exactly."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("views") / "images"
    rng = random.Random(5)
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(5):
            w, h = rng.randint(20, 30), rng.randint(20, 30)
            Image.frombytes("RGB", (w, h), rng.randbytes(w * h * 3)).save(
                root / f"c{c}" / f"{i:03}.jpg", quality=90)
    return root


def loader(root, daemon, job, **kw):
    kw.setdefault("views", VIEWS)
    return stoker.Loader(root, batch_size=4, crop=GLOBAL, dtype="u8", epochs=2, seed=SEED,
                         shuffle=False, job=job, socket=daemon, autostart=False, **kw)


def drain(ld):
    """[(epoch, step, labels, [view arrays])] of every batch left in `ld`."""
    out = []
    for b in ld.batches():
        views = [np.array(np.from_dlpack(t), copy=True) for t in b.views]
        out.append((b.epoch, b.step, np.from_dlpack(b.labels).tolist(), views))
    return out


def same(a, b):
    return len(a) == len(b) and all(
        x[:3] == y[:3] and len(x[3]) == len(y[3])
        and all(np.array_equal(u, v) for u, v in zip(x[3], y[3])) for x, y in zip(a, b))


def test_eight_views_a_batch_view_0_a_one_view_loaders(small, daemon):
    with loader(small, daemon, "py-views") as ld:
        it = iter(ld)
        images, labels = next(it)
        assert isinstance(images, list) and len(images) == 8
        n = len(labels)
        for v, t in enumerate(images):
            side = GLOBAL if v < 2 else LOCAL
            assert np.from_dlpack(t).shape == (n, 3, side, side), v
        del images, labels, it
    with loader(small, daemon, "py-views-all") as ld:
        got = drain(ld)
    assert len(got) == 6 and all(len(b[3]) == 8 for b in got)
    assert not np.array_equal(got[0][3][2], got[0][3][3]), "two local views of one image differ"
    with loader(small, daemon, "py-one-view", views=None, scale=(0.4, 1.0)) as ld:
        one = [(b.epoch, b.step, np.array(np.from_dlpack(b.images), copy=True))
               for b in ld.batches()]
    assert [(e, s) for e, s, _ in one] == [b[:2] for b in got]
    for (_, _, view0), b in zip(one, got):
        assert np.array_equal(view0, b[3][0])


def test_views_are_the_same_again_and_after_a_resume(small, daemon):
    with loader(small, daemon, "py-views-a") as ld:
        first = drain(ld)
    with loader(small, daemon, "py-views-b") as ld:
        assert same(drain(ld), first)
    with loader(small, daemon, "py-views-resume") as ld:
        next(iter(ld))
        state = ld.state_dict()
    with loader(small, daemon, "py-views-resume") as ld:
        ld.load_state_dict(state)
        assert same(drain(ld), first[1:])


def test_views_are_checked_at_the_loader(small):
    for views, names in (([{"crop": 0}], "views[0].crop"),
                         ([16, {"crop": 8, "size": 3}], "views[1]"),
                         ([16, {"crop": 8, "scale": (0.5, 0.1)}], "views[1].scale"),
                         ([16] * 17, "views"),
                         ("dino", "views")):
        with pytest.raises(stoker.SpecError, match=re.escape(f"Loader({names}=")):
            stoker.Loader(small, views=views, autostart=False, socket="/nonexistent")


def test_views_beside_a_whole_spec_are_refused(small):
    spec = {"batch_size": 4, "crop": {"kind": "center", "size": 16}}
    with pytest.raises(ValueError, match="extra_views"):
        stoker.Loader(small, spec=spec, views=[16, 8], autostart=False, socket="/nonexistent")
