"""Against a real stokerd (CPU backend): a dataset mixing JPEG, CMYK JPEG, PNG (8 and 16 bit,
gray, gray+alpha, palette with and without transparency, 1-bit, RGBA) and WebP (lossless and
lossy, with and without alpha), written by Pillow and a hand-written PNG writer, is served
whole: no replaced sample, each image's pixels those Pillow decodes (within 1 LSB for the
lossless formats, PSNR >= 35 dB for the lossy ones, whose decoders may round differently)."""

import json
import shutil
import subprocess

import numpy as np
import pytest

import stoker
from stoker._daemon import bundled
from formats_data import HEIGHT, LOSSLESS, WIDTH, png_bomb, reference, write_dataset

MIN_LOSSY_PSNR = 35


@pytest.fixture(scope="module")
def formats_dataset(tmp_path_factory):
    pytest.importorskip("PIL.Image", reason="Pillow writes the test images")
    root = tmp_path_factory.mktemp("formats") / "images"
    files = write_dataset(root / "mixed")
    return root, files


def whole_images(root, socket, n, **kw):
    """One evaluation batch of every sample, unscaled: (images NHWC u8, indices, status)."""
    spec = stoker.build_spec(n, (HEIGHT, WIDTH), train=False, resize=HEIGHT, dtype="u8",
                             layout="nhwc", epochs=1)
    with stoker.Loader(root, spec=spec, socket=socket, autostart=False, **kw) as ld:
        assert ld.info["dataset_len"] == n, "every file is indexed"
        b = ld.next_batch()
        return (np.from_dlpack(b.images).copy(), np.from_dlpack(b.indices).copy(),
                np.from_dlpack(b.status).copy())


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


def test_every_format_is_served_with_pillows_pixels(formats_dataset, daemon):
    root, files = formats_dataset
    images, indices, status = whole_images(root, daemon, len(files), job="formats")
    assert list(indices) == list(range(len(files)))
    bad = [files[i][0] for i in range(len(files)) if status[i] != 0]
    assert not bad, f"replaced or failed samples: {bad}"
    for i, (name, kind) in enumerate(files):
        want = reference(root / "mixed" / name)
        got = images[i]
        diff = int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max())
        print(f"{name}: largest difference {diff}, PSNR {psnr(got, want):.1f} dB")
        if kind in LOSSLESS:
            assert diff <= 1, f"{name}: off by {diff} from Pillow's decode"
        else:
            db = psnr(got, want)
            assert db >= MIN_LOSSY_PSNR, f"{name}: PSNR {db:.1f} dB against Pillow's decode"


def test_check_passes_every_format_and_names_a_png_bomb(formats_dataset, tmp_path):
    """`stoker check` decodes every file of the mixed dataset, and reports a decompression-bomb
    PNG (a few dozen bytes claiming 100000 x 100000 pixels) by name as too large."""
    root, files = formats_dataset
    mixed = tmp_path / "mixed"
    shutil.copytree(root / "mixed", mixed)
    png_bomb(mixed / "99_bomb.png")
    p = subprocess.run([bundled("stoker"), "check", "--json", str(mixed)], capture_output=True,
                       timeout=300)
    report = json.loads(p.stdout)
    assert p.returncode != 0, "a failed sample fails the check"
    assert (report["total"], report["ok"]) == (len(files) + 1, len(files)), report
    [failure] = report["failures"]
    assert failure["name"].endswith("99_bomb.png") and failure["reason"] == "too_large", failure
    assert "100000x100000" in failure["message"], failure
