"""A dataset of every image format stoker decodes, written by encoders independent of stoker's
decoders (Pillow's libpng/zlib, libwebp and libjpeg, and a hand-written 16-bit PNG writer),
and the pixels Pillow decodes from each file: the reference the served samples are held to.

All images are HEIGHT x WIDTH, so `Loader(train=False, crop=(HEIGHT, WIDTH), resize=HEIGHT)`
serves each one whole, unscaled (the identity crop), and the served pixels are the decoder's.
"""

import struct
import zlib

import numpy as np

HEIGHT, WIDTH = 24, 36
# Formats whose decode is exact: the served pixels are Pillow's within 1 LSB.
LOSSLESS = ("png", "webp-lossless")


def _picture(seed, channels=3, depth=8):
    """A smooth gradient with some texture (lossy codecs keep it recognisable)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    top = (1 << depth) - 1
    planes = [(x * top) // (WIDTH - 1), (y * top) // (HEIGHT - 1),
              ((x + y) * top) // (WIDTH + HEIGHT - 2), ((x * y) * top) // (WIDTH * HEIGHT)]
    rng = np.random.default_rng(seed)
    out = np.stack(planes[:channels], axis=-1).astype(np.int64)
    out = np.roll(out, seed, axis=1) + rng.integers(-top // 40, top // 40 + 1, out.shape)
    return np.clip(out, 0, top).astype(np.uint16 if depth == 16 else np.uint8)


def _png(width, height, depth, color_type, idat):
    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    ihdr = struct.pack(">IIBBBBB", width, height, depth, color_type, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def png_by_hand(path, pixels, color_type):
    """A PNG written without Pillow or libpng: 16-bit samples (which Pillow cannot write from
    RGB arrays), filter 0 on every row, one zlib stream."""
    h, w = pixels.shape[:2]
    raw = b"".join(b"\0" + pixels[r].astype(">u2").tobytes() for r in range(h))
    path.write_bytes(_png(w, h, 16, color_type, zlib.compress(raw, 9)))


def png_bomb(path):
    """A decompression bomb: a valid PNG of a few dozen bytes claiming 100000 x 100000 RGB
    pixels (30 GB decoded)."""
    path.write_bytes(_png(100_000, 100_000, 8, 2, zlib.compress(b"")))


def write_dataset(folder):
    """Writes the files into `folder` (one class); returns [(file name, kind)] in the order an
    ImageFolder indexes them (sorted names)."""
    from PIL import Image

    folder.mkdir(parents=True)
    files = []

    def save(name, kind, img, **kw):
        img.save(folder / name, **kw)
        files.append((name, kind))

    rgb = Image.fromarray(_picture(1))
    save("00_rgb.jpg", "jpeg", rgb, quality=95, subsampling=0)
    save("01_cmyk.jpg", "jpeg", rgb.convert("CMYK"), quality=95)
    save("02_rgb.png", "png", Image.fromarray(_picture(2)))
    save("03_rgba.png", "png", Image.fromarray(_picture(3, 4)))
    save("04_gray.png", "png", Image.fromarray(_picture(4)[..., 0]))
    save("05_gray_alpha.png", "png", Image.fromarray(_picture(5, 4)[..., :2], "LA"))
    palette = Image.fromarray(_picture(6)).quantize(64)
    save("06_palette.png", "png", palette)
    save("07_palette_transparent.png", "png", palette, transparency=3)
    save("08_bilevel.png", "png", Image.fromarray(_picture(8)[..., 0] > 128))
    save("09_gray16.png", "png", Image.fromarray(_picture(9, 1, 16)[..., 0]))
    png_by_hand(folder / "10_rgb16.png", _picture(10, 3, 16), color_type=2)
    files.append(("10_rgb16.png", "png"))
    png_by_hand(folder / "11_rgba16.png", _picture(11, 4, 16), color_type=6)
    files.append(("11_rgba16.png", "png"))
    save("12_lossless.webp", "webp-lossless", Image.fromarray(_picture(12)), lossless=True)
    save("13_lossless_alpha.webp", "webp-lossless", Image.fromarray(_picture(13, 4)),
         lossless=True)
    save("14_lossy.webp", "webp-lossy", Image.fromarray(_picture(14)), quality=95)
    save("15_lossy_alpha.webp", "webp-lossy", Image.fromarray(_picture(15, 4)), quality=95)
    return files


def reference(path):
    """Pillow's RGB pixels of `path` (HEIGHT x WIDTH x 3, uint8), alpha dropped as
    `convert("RGB")` drops it. 16-bit samples become their high byte: Pillow does so itself for
    16-bit colour; its 16-bit grayscale ("I;16") converts by clipping at 255 instead, so that
    one is shifted here."""
    from PIL import Image

    with Image.open(path) as img:
        if img.mode in ("I;16", "I;16B", "I"):
            gray = (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
            return np.repeat(gray[..., None], 3, axis=-1)
        return np.asarray(img.convert("RGB"))


# What Pillow's `exif_transpose` undoes for each EXIF orientation: writing the shown picture
# through this gives the stored pixels of a file with that orientation.
_STORE = {2: "FLIP_LEFT_RIGHT", 3: "ROTATE_180", 4: "FLIP_TOP_BOTTOM", 5: "TRANSPOSE",
          6: "ROTATE_90", 7: "TRANSVERSE", 8: "ROTATE_270"}


def write_oriented(folder, exif=True):
    """JPEGs `o1.jpg` .. `o8.jpg` each showing the same WIDTH x HEIGHT picture once turned by
    its EXIF orientation (stored turned the other way, so orientations 5 to 8 are stored
    HEIGHT x WIDTH); `exif=False` writes the same stored pixels with no EXIF."""
    from PIL import Image

    folder.mkdir(parents=True)
    shown = Image.fromarray(_picture(20))
    names = []
    for o in range(1, 9):
        stored = shown.transpose(getattr(Image.Transpose, _STORE[o])) if o > 1 else shown
        kw = {"quality": 95, "subsampling": 0}
        if exif:
            tags = Image.Exif()
            tags[0x0112] = o
            kw["exif"] = tags
        stored.save(folder / f"o{o}.jpg", **kw)
        names.append(f"o{o}.jpg")
    return names


def transposed(path):
    """Pillow's `ImageOps.exif_transpose` of `path`, as RGB."""
    from PIL import Image, ImageOps

    with Image.open(path) as img:
        return np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
