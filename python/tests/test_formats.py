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
from formats_data import (HEIGHT, LOSSLESS, WIDTH, png_bomb, reference, transposed,
                          write_dataset, write_oriented)

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


@pytest.fixture(scope="module")
def oriented(tmp_path_factory):
    """(tagged, untagged, turned): the 8 EXIF orientations as JPEGs; the same stored pixels
    without EXIF; Pillow's `exif_transpose` of each tagged file as a (lossless) PNG."""
    from PIL import Image

    root = tmp_path_factory.mktemp("oriented")
    names = write_oriented(root / "tagged" / "c")
    write_oriented(root / "untagged" / "c", exif=False)
    (root / "turned" / "c").mkdir(parents=True)
    for n in names:
        Image.fromarray(transposed(root / "tagged" / "c" / n)).save(
            root / "turned" / "c" / n.replace(".jpg", ".png"))
    return root / "tagged", root / "untagged", root / "turned", names


def batch(root, socket, spec, job, **kw):
    with stoker.Loader(root, spec=spec, socket=socket, autostart=False, job=job, seed=7,
                       **kw) as ld:
        b = ld.next_batch()
        return (np.from_dlpack(b.images).copy(), np.from_dlpack(b.indices).copy(),
                np.from_dlpack(b.status).copy())


def test_each_exif_orientation_gives_pillows_exif_transpose(oriented, daemon):
    tagged, _, _, names = oriented
    spec = stoker.build_spec(8, (HEIGHT, WIDTH), train=False, resize=HEIGHT, dtype="u8",
                             layout="nhwc", epochs=1, exif_orientation=True)
    assert spec["exif_orientation"] is True
    images, indices, status = batch(tagged, daemon, spec, "exif-on")
    assert list(indices) == list(range(8)) and not status.any()
    for i, name in enumerate(names):
        want = transposed(tagged / "c" / name)
        assert want.shape == images[i].shape, name
        diff = int(np.abs(images[i].astype(np.int16) - want.astype(np.int16)).max())
        assert diff <= 1, f"{name}: off by {diff} from Pillow's exif_transpose"


def test_random_crops_with_exif_orientation_are_crops_of_the_turned_image(oriented, daemon):
    """The crop is drawn on the image as shown: each random crop (and flip) of a tagged JPEG
    equals the same crop of Pillow's turned picture, written as a PNG without EXIF."""
    tagged, _, turned, _ = oriented
    on = stoker.build_spec(8, (20, 30), scale=(0.3, 1.0), dtype="u8", layout="nhwc",
                           epochs=1, shuffle=False, exif_orientation=True)
    plain = {k: v for k, v in on.items() if k != "exif_orientation"}
    got, gi, gs = batch(tagged, daemon, on, "exif-crops")
    want, wi, ws = batch(turned, daemon, plain, "exif-crops-turned")
    assert list(gi) == list(wi) and not gs.any() and not ws.any()
    diff = int(np.abs(got.astype(np.int16) - want.astype(np.int16)).max())
    assert diff <= 1, f"random crops off by {diff} from the turned pictures' crops"


def test_exif_orientation_off_serves_the_stored_pixels(oriented, daemon):
    """Off (the default), a tagged file gives exactly what the same file without EXIF gives."""
    tagged, untagged, _, _ = oriented
    spec = stoker.build_spec(8, (20, 30), dtype="u8", layout="nhwc", epochs=1, shuffle=False)
    assert "exif_orientation" not in spec
    a, ai, _ = batch(tagged, daemon, spec, "exif-off")
    b, bi, _ = batch(untagged, daemon, spec, "exif-untagged")
    assert list(ai) == list(bi) and np.array_equal(a, b)
    turned_on, _, _ = batch(tagged, daemon, {**spec, "exif_orientation": True}, "exif-on-2")
    assert not np.array_equal(a, turned_on), "the option changes the pixels of turned files"


# torchvision.datasets.folder.IMG_EXTENSIONS: the files an ImageFolder takes as samples.
TORCHVISION_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff",
                          ".webp")


@pytest.fixture(scope="module")
def more_formats(tmp_path_factory):
    """One class of BMP (24-bit, 8-bit palette, 32-bit, gray), TIFF (8-bit RGB uncompressed,
    LZW, Deflate and PackBits; gray; RGBA), PPM and PGM files written by Pillow, a JPEG, and
    two files torchvision leaves out (a GIF, a text file); [(name, kind)] of the samples."""
    from PIL import Image
    from formats_data import _picture

    folder = tmp_path_factory.mktemp("more") / "images" / "c"
    folder.mkdir(parents=True)
    files = []

    def save(name, img, **kw):
        img.save(folder / name, **kw)
        files.append(name)

    rgb = lambda seed, ch=3: Image.fromarray(_picture(seed, ch))  # noqa: E731
    save("00_rgb.bmp", rgb(30))
    save("01_palette.bmp", rgb(31).quantize(64))
    save("02_rgba.bmp", rgb(32, 4))
    save("03_gray.bmp", rgb(33).convert("L"))
    save("04_rgb.tif", rgb(34))
    save("05_lzw.tiff", rgb(35), compression="tiff_lzw")
    save("06_deflate.tif", rgb(36), compression="tiff_adobe_deflate")
    save("07_packbits.tif", rgb(37), compression="packbits")
    save("08_gray.tif", rgb(38).convert("L"))
    save("09_rgba.tif", rgb(39, 4))
    save("10_rgb.ppm", rgb(40))
    save("11_gray.pgm", rgb(41).convert("L"))
    save("12_rgb.jpg", rgb(42), quality=95)
    rgb(43).save(folder / "13_other.gif")
    (folder / "notes.txt").write_text("not an image")
    return folder.parent, files


def test_bmp_tiff_and_netpbm_are_samples_with_pillows_pixels(more_formats, daemon):
    """Issue 43 item 3: as torchvision's ImageFolder, BMP, TIFF, PPM and PGM files are samples
    (they were skipped: 301 samples against torchvision's 303 on a folder with a BMP and a
    TIFF), decoded as Pillow decodes them."""
    root, files = more_formats
    want_n = sum(1 for p in (root / "c").iterdir() if p.suffix.lower() in TORCHVISION_EXTENSIONS)
    assert want_n == len(files) == 13
    images, indices, status = whole_images(root, daemon, want_n, job="more-formats")
    bad = [files[i] for i in range(want_n) if status[i] != 0]
    assert not bad, f"replaced or failed samples: {bad}"
    for i, name in enumerate(files):
        want = reference(root / "c" / name)
        diff = int(np.abs(images[i].astype(np.int16) - want.astype(np.int16)).max())
        if name.endswith(".jpg"):
            assert psnr(images[i], want) >= MIN_LOSSY_PSNR, name
        else:
            assert diff == 0, f"{name}: off by {diff} from Pillow's decode"
