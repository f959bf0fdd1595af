"""torchvision's pixels and torchvision's draws (issue 39 item 2), through the `stoker ops` tool
(`stoker ops apply`: one step with explicit parameters on 8-bit RGB; `stoker ops draw`: the
steps a view's operations draw per sample).

1. Each step against torchvision.transforms.v2.functional on the same uint8 image (random
   pixels and real photos from ../shared/data/photos, several sizes, odd ones included, several
   parameter values): the integer operations (posterize, solarize, equalize, autocontrast,
   grayscale, invert, vertical_flip) equal, the others at least 40 dB PSNR.
2. The drawn steps against torchvision's own draws: the same torchvision transform runs under
   `torch.manual_seed` on an image of the same size with its kernels recorded instead of run
   (`_call_kernel`, and the functional calls of the automatic augmentations), which gives
   torchvision's steps in the same vocabulary. The structure (which steps, in which order,
   with which fixed arguments) and the discrete magnitudes are compared with a chi-square test
   of homogeneity, the continuous parameters with a two-sample Kolmogorov-Smirnov test, at a
   fixed seed on both sides (deterministic), failing below p = 0.001.

Needs torch and torchvision (skipped without), scipy for the statistics (jax brings it), and
the `stoker` tool built with its `ops` command (skipped without, failed under
STOKER_REQUIRE_DAEMON=1)."""

import json
import math
import os
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
stats = pytest.importorskip("scipy.stats")
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2 as T  # noqa: E402
from torchvision.transforms.v2 import functional as F  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PHOTOS = REPO.parent / "shared" / "data" / "photos"
# Sizes (height, width) of the equality tests: odd, even, portrait, landscape.
SIZES = [(37, 53), (64, 48), (97, 131)]
# Samples drawn on each side of a distribution test (a policy's steps have hundreds of
# categories: more samples), and the significance level.
N = 2000
N_POLICY = 4000
ALPHA = 1e-3


def find_tool():
    if os.environ.get("STOKER_TOOL"):
        return Path(os.environ["STOKER_TOOL"])
    dirs = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    dirs.append(REPO / "target")
    for d in dirs:
        for profile in ("debug", "release"):
            if (d / profile / "stoker").is_file():
                return d / profile / "stoker"
    return None


@pytest.fixture(scope="module")
def tool():
    exe = find_tool()
    why = None
    if exe is None:
        why = "the stoker tool is not built (cargo build -p stoker-tool), or set STOKER_TOOL"
    else:
        r = subprocess.run([str(exe), "ops", "--help"], capture_output=True, text=True)
        if r.returncode != 0:
            why = f"{exe} has no `ops` command: {(r.stderr or r.stdout)[-300:]}"
    if why is not None:
        if os.environ.get("STOKER_REQUIRE_DAEMON") == "1":
            pytest.fail(f"{why} (STOKER_REQUIRE_DAEMON=1)")
        pytest.skip(why)
    return str(exe)


def apply(tool, step, hwc):
    """`stoker ops apply` of `step` on an (H, W, 3) uint8 array."""
    h, w, _ = hwc.shape
    r = subprocess.run([tool, "ops", "apply", "--step", json.dumps(step), "--size", f"{h}x{w}"],
                       input=np.ascontiguousarray(hwc).tobytes(), capture_output=True)
    assert r.returncode == 0, f"stoker ops apply {step}: {r.stderr.decode(errors='replace')}"
    assert len(r.stdout) == h * w * 3, f"{step}: {len(r.stdout)} bytes for {h}x{w}"
    return np.frombuffer(r.stdout, dtype=np.uint8).reshape(h, w, 3)


def draw(tool, ops, size, seed, count):
    """`stoker ops draw`: the list of steps of each of `count` samples."""
    h, w = size
    r = subprocess.run([tool, "ops", "draw", "--ops", json.dumps(ops), "--size", f"{h}x{w}",
                        "--seed", str(seed), "--count", str(count)],
                       capture_output=True, text=True)
    assert r.returncode == 0, f"stoker ops draw {ops}: {r.stderr}"
    lines = r.stdout.splitlines()
    assert len(lines) == count, f"{count} samples asked, {len(lines)} lines"
    return [json.loads(line) for line in lines]


# --- images -------------------------------------------------------------------------------


def images():
    """[(name, (H, W, 3) uint8)]: random pixels, a smooth gradient (where rounding shows) and
    photos, at each of SIZES."""
    rng = np.random.default_rng(39)
    out = []
    photos = sorted(PHOTOS.glob("*.JPEG"))[:40:13] if PHOTOS.is_dir() else []
    for h, w in SIZES:
        out.append((f"random {h}x{w}", rng.integers(0, 256, (h, w, 3), dtype=np.uint8)))
        y, x = np.mgrid[0:h, 0:w]
        grad = np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1),
                         (x + y) * 255 // (h + w - 2)], axis=-1).astype(np.uint8)
        out.append((f"gradient {h}x{w}", grad))
    if photos:
        from PIL import Image
        for i, path in enumerate(photos):
            h, w = SIZES[i % len(SIZES)]
            with Image.open(path) as im:
                im = im.convert("RGB").resize((w, h), Image.BILINEAR)
                out.append((f"{path.name} {h}x{w}", np.asarray(im).copy()))
    return out


IMAGES = images()


def test_there_are_photos():
    """The equality tests read real photos; without ../shared/data they would test random and
    gradient pixels only."""
    if not PHOTOS.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{PHOTOS} is missing")
        pytest.skip(f"{PHOTOS} is missing: the pixel tests use random and gradient pixels only")
    assert sum(1 for name, _ in IMAGES if ".JPEG" in name) >= 3


def torchvision_step(step, hwc):
    """torchvision.transforms.v2.functional's result of `step` on `hwc`, as (H, W, 3)."""
    img = tv_tensors.Image(torch.from_numpy(np.ascontiguousarray(hwc)).permute(2, 0, 1))
    kind = step["kind"]
    if kind in ("brightness", "contrast", "saturation", "hue", "sharpness"):
        fn = {"brightness": F.adjust_brightness, "contrast": F.adjust_contrast,
              "saturation": F.adjust_saturation, "hue": F.adjust_hue,
              "sharpness": F.adjust_sharpness}[kind]
        out = fn(img, step["factor"])
    elif kind == "grayscale":
        out = F.rgb_to_grayscale(img, num_output_channels=3)
    elif kind == "gaussian_blur":
        out = F.gaussian_blur(img, kernel_size=step["kernel_size"], sigma=step["sigma"])
    elif kind == "solarize":
        out = F.solarize(img, threshold=step["threshold"])
    elif kind == "posterize":
        out = F.posterize(img, bits=step["bits"])
    elif kind in ("equalize", "autocontrast", "invert", "vertical_flip"):
        out = getattr(F, kind)(img)
    elif kind == "affine":
        out = F.affine(img, angle=step["angle"], translate=step["translate"],
                       scale=step["scale"], shear=step["shear"],
                       interpolation=T.InterpolationMode(step["interpolation"]),
                       fill=step["fill"], center=step["center"])
    elif kind == "rotate":
        out = F.rotate(img, angle=step["angle"], interpolation=T.InterpolationMode(
            step["interpolation"]), expand=False, center=step["center"], fill=step["fill"])
    else:
        raise AssertionError(kind)
    return out.permute(1, 2, 0).numpy()


def psnr(a, b):
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


EXACT = [{"kind": "posterize", "bits": b} for b in (0, 1, 3, 5, 8)] + \
    [{"kind": "solarize", "threshold": t} for t in (0.0, 1.0, 77.5, 128.0, 255.0)] + \
    [{"kind": k} for k in ("equalize", "autocontrast", "grayscale", "invert", "vertical_flip")]

FILL = [0.0, 0.0, 0.0]
CLOSE = (
    [{"kind": "brightness", "factor": f} for f in (0.0, 0.37, 1.0, 1.6, 2.5)]
    + [{"kind": "contrast", "factor": f} for f in (0.0, 0.5, 1.0, 1.4, 3.0)]
    + [{"kind": "saturation", "factor": f} for f in (0.0, 0.2, 1.0, 1.8)]
    + [{"kind": "hue", "factor": f} for f in (-0.5, -0.23, -0.01, 0.0, 0.1, 0.37, 0.5)]
    + [{"kind": "sharpness", "factor": f} for f in (0.0, 0.3, 1.0, 1.99, 4.0)]
    + [{"kind": "gaussian_blur", "kernel_size": k, "sigma": s}
       for k, s in (([3, 3], [0.1, 0.1]), ([5, 3], [1.0, 0.6]), ([23, 23], [2.0, 2.0]),
                    ([9, 15], [0.7, 3.1]), ([1, 7], [1.2, 1.2]))]
    + [{"kind": "affine", "angle": a, "translate": t, "scale": s, "shear": sh,
        "interpolation": i, "fill": f, "center": c}
       for a, t, s, sh, i, f, c in (
           (0.0, [0, 0], 1.0, [0.0, 0.0], "nearest", FILL, None),
           (0.0, [5, -3], 1.0, [0.0, 0.0], "nearest", FILL, None),
           (0.0, [-12, 0], 1.0, [0.0, 0.0], "bilinear", [128.0, 64.0, 255.0], None),
           (0.0, [0, 0], 1.0, [16.7, 0.0], "nearest", FILL, [0.0, 0.0]),
           (0.0, [0, 0], 1.0, [0.0, -30.2], "bilinear", [10.0, 20.0, 30.0], [0.0, 0.0]),
           (17.3, [3, 4], 0.85, [5.0, -7.0], "bilinear", FILL, None),
           (-42.0, [0, 0], 1.2, [0.0, 0.0], "nearest", [255.0, 255.0, 255.0], [10.0, 7.5]))]
    + [{"kind": "rotate", "angle": a, "interpolation": i, "fill": f, "center": c}
       for a, i, f, c in ((0.0, "nearest", FILL, None), (90.0, "nearest", FILL, None),
                          (-13.7, "bilinear", [50.0, 100.0, 150.0], None),
                          (30.0, "nearest", FILL, None), (135.0, "bilinear", FILL, [3.0, 4.0]),
                          (-7.25, "nearest", [255.0, 0.0, 0.0], [0.0, 0.0]))]
)


@pytest.mark.parametrize("step", EXACT, ids=lambda s: json.dumps(s, separators=(",", ":")))
def test_integer_operations_equal_torchvision(tool, step):
    for name, img in IMAGES:
        got, want = apply(tool, step, img), torchvision_step(step, img)
        diff = np.argwhere(got != want)
        assert diff.size == 0, (f"{name}: {len(diff)} of {img.size} values differ from "
                                f"torchvision, first at {diff[0].tolist()}: stoker "
                                f"{got[tuple(diff[0])]}, torchvision {want[tuple(diff[0])]}")


# The lowest PSNR of each step kind over every image and parameter, reported by the last test.
WORST = {}


@pytest.mark.parametrize("step", CLOSE, ids=lambda s: json.dumps(s, separators=(",", ":")))
def test_operations_are_within_40_db_of_torchvision(tool, step):
    for name, img in IMAGES:
        got, want = apply(tool, step, img), torchvision_step(step, img)
        db = psnr(got, want)
        kind = step["kind"]
        WORST[kind] = min(WORST.get(kind, math.inf), db)
        assert db >= 40.0, f"{name}: {db:.1f} dB from torchvision (at least 40)"


def test_report_the_lowest_psnr_per_operation(tool):
    """Prints the lowest PSNR of each operation (pytest -s shows it); fails if none ran."""
    if not WORST:
        pytest.skip("run with the PSNR tests (this one only reports their figures)")
    for kind, db in sorted(WORST.items()):
        print(f"psnr {kind}: lowest {db:.1f} dB")
    assert all(db >= 40.0 for db in WORST.values())


def test_a_bad_step_is_refused_naming_it(tool):
    r = subprocess.run([tool, "ops", "apply", "--step", '{"kind": "posterize", "bits": 9}',
                        "--size", "2x2"], input=bytes(12), capture_output=True)
    err = r.stderr.decode(errors="replace")
    assert r.returncode != 0 and "posterize" in err and "9" in err, err
    r = subprocess.run([tool, "ops", "apply", "--step", '{"kind": "invert"}', "--size", "2x2"],
                       input=bytes(11), capture_output=True)
    err = r.stderr.decode(errors="replace")
    assert r.returncode != 0 and "12" in err, f"11 bytes for 2x2x3 must be refused: {err}"


# --- torchvision's draws, recorded ----------------------------------------------------------

# functional -> (step kind, {functional argument: step field}).
KERNELS = {
    "adjust_brightness": ("brightness", {"brightness_factor": "factor"}),
    "adjust_contrast": ("contrast", {"contrast_factor": "factor"}),
    "adjust_saturation": ("saturation", {"saturation_factor": "factor"}),
    "adjust_hue": ("hue", {"hue_factor": "factor"}),
    "adjust_sharpness": ("sharpness", {"sharpness_factor": "factor"}),
    "rgb_to_grayscale": ("grayscale", {}),
    "gaussian_blur": ("gaussian_blur", {"kernel_size": "kernel_size", "sigma": "sigma"}),
    "solarize": ("solarize", {"threshold": "threshold"}),
    "posterize": ("posterize", {"bits": "bits"}),
    "equalize": ("equalize", {}),
    "autocontrast": ("autocontrast", {}),
    "invert": ("invert", {}),
    "vertical_flip": ("vertical_flip", {}),
    "affine": ("affine", {k: k for k in ("angle", "translate", "scale", "shear",
                                         "interpolation", "fill", "center")}),
    "rotate": ("rotate", {k: k for k in ("angle", "interpolation", "fill", "center")}),
}
# Positional arguments torchvision passes to these kernels.
POSITIONAL = {"gaussian_blur": ("kernel_size",)}


def _plain(field, v):
    """A functional's argument as the step's JSON has it."""
    if field == "interpolation":
        return getattr(v, "value", v)
    if field == "fill":
        if v is None:
            return [0.0, 0.0, 0.0]
        v = [float(x) for x in (v if isinstance(v, (list, tuple)) else [v])]
        return v * 3 if len(v) == 1 else v
    if isinstance(v, torch.Tensor):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [float(x) for x in v] if field != "kernel_size" else [int(x) for x in v]
    if field == "bits":
        return int(v)
    return None if v is None else float(v)


def _record(steps, name, args, kwargs):
    kind, fields = KERNELS[name]
    given = dict(zip(POSITIONAL.get(name, ()), args))
    given.update(kwargs)
    step = {"kind": kind}
    for arg, field in fields.items():
        if arg in given:
            step[field] = _plain(field, given[arg])
    if kind in ("affine", "rotate"):
        step.setdefault("center", None)
        step.setdefault("fill", [0.0, 0.0, 0.0])
    steps.append(step)


def torchvision_draws(transform, size, seed, count):
    """The steps torchvision's `transform` takes on `count` calls after torch.manual_seed(seed),
    on a uint8 image of `size`, its kernels recorded instead of run."""
    import torchvision.transforms.v2._auto_augment as auto
    steps = []

    def call_kernel(functional, inpt, *args, **kwargs):
        _record(steps, functional.__name__, args, kwargs)
        return inpt

    def walk(t):
        """`t` and the transforms inside it (v2's containers keep plain lists)."""
        yield t
        for child in getattr(t, "transforms", None) or []:
            yield from walk(child)

    for m in walk(transform):
        m._call_kernel = call_kernel

    class Recorder:
        """torchvision's functional module, its image kernels recorded instead of run."""

        def __getattr__(self, name):
            if name not in KERNELS:
                return getattr(F, name)

            def kernel(inpt, *args, **kwargs):
                _record(steps, name, args, kwargs)
                return inpt
            return kernel

    img = tv_tensors.Image(torch.zeros(3, *size, dtype=torch.uint8))
    saved = auto.F
    auto.F = Recorder()
    out = []
    try:
        torch.manual_seed(seed)
        for _ in range(count):
            steps.clear()
            transform(img)
            out.append([dict(s) for s in steps])
    finally:
        auto.F = saved
    return out


# --- comparing two samples of step lists ------------------------------------------------------

# Continuous parameters (compared by KS, left out of the structure keys).
CONTINUOUS = {"brightness": ("factor",), "contrast": ("factor",), "saturation": ("factor",),
              "hue": ("factor",), "gaussian_blur": ("sigma",),
              "affine": ("angle", "translate", "scale", "shear"), "rotate": ("angle",)}


def _snap(v, known):
    """`v` as the nearest of the values torchvision drew for that field, when within float
    rounding of it (stoker's magnitudes are f32, torchvision's f32 widened to f64)."""
    if isinstance(v, list):
        return tuple(_snap(x, known) for x in v)
    if isinstance(v, float) and known:
        near = min(known, key=lambda k: abs(k - v))
        if abs(near - v) <= 1e-3 * (1 + abs(v)):
            return near
    return v


def _values(draws):
    """{(step kind, field): every scalar torchvision drew there}, for snapping stoker's values
    onto them."""
    out = {}
    for steps in draws:
        for s in steps:
            for field, v in s.items():
                for x in (v if isinstance(v, list) else [v]):
                    if isinstance(x, float):
                        out.setdefault((s["kind"], field), set()).add(x)
    return {k: sorted(v) for k, v in out.items()}


def _key(steps, continuous, known):
    """One sample's structure: its steps' kinds and fixed arguments (all arguments, snapped,
    when `continuous` is False)."""
    out = []
    for s in steps:
        skip = CONTINUOUS.get(s["kind"], ()) if continuous else ()
        out.append(tuple(sorted((k, _snap(v, known.get((s["kind"], k), ())))
                                for k, v in s.items() if k not in skip)))
    return tuple(out)


def chi_square(ours, theirs, what):
    """Chi-square test of homogeneity of two samples of hashable categories; rare categories
    (expected fewer than 5 per side) pooled."""
    a, b = Counter(ours), Counter(theirs)
    cats = sorted(set(a) | set(b), key=repr)
    rows, pooled = [], [0, 0]
    for c in cats:
        if a[c] + b[c] < 10:
            pooled[0] += a[c]
            pooled[1] += b[c]
        else:
            rows.append([a[c], b[c]])
    if sum(pooled) >= 10:
        rows.append(pooled)
    unseen = [c for c in cats if b[c] == 0 and a[c] >= 10]
    assert not unseen, f"{what}: stoker draws what torchvision never does: {unseen[:3]}"
    if len(rows) < 2:
        return 1.0
    p = stats.chi2_contingency(np.array(rows).T)[1]
    assert p > ALPHA, (f"{what}: chi-square p = {p:.2e}; stoker vs torchvision counts: " +
                       ", ".join(f"{c!r}: {a[c]}/{b[c]}" for c in cats[:12]))
    return p


def ks(ours, theirs, what):
    assert len(ours) >= 20 and len(theirs) >= 20, f"{what}: too few values"
    p = stats.ks_2samp(ours, theirs).pvalue
    assert p > ALPHA, (f"{what}: KS p = {p:.2e}; stoker {np.percentile(ours, [0, 50, 100])}, "
                       f"torchvision {np.percentile(theirs, [0, 50, 100])}")
    return p


def compare(ours, theirs, continuous=True):
    """Structure by chi-square; each continuous parameter (per step kind, per component) by
    KS."""
    known = _values(theirs)
    chi_square([_key(s, continuous, known) for s in ours],
               [_key(s, continuous, known) for s in theirs], "steps")
    if not continuous:
        return
    fields = {}
    for side, draws in ((0, ours), (1, theirs)):
        for steps in draws:
            for s in steps:
                for field in CONTINUOUS.get(s["kind"], ()):
                    v = s[field]
                    for i, x in enumerate(v if isinstance(v, list) else [v]):
                        fields.setdefault((s["kind"], field, i), ([], []))[side].append(x)
    for (kind, field, i), (a, b) in sorted(fields.items()):
        if np.ptp(b) == 0:
            assert np.allclose(a, b[0], rtol=1e-5, atol=1e-6), (kind, field, i, a[:5], b[0])
        else:
            ks(a, b, f"{kind}.{field}[{i}]")


# (spec operation, the torchvision transform with the same parameters, image size)
RANDOM_OPS = [
    ({"kind": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4],
      "saturation": [0.8, 1.2], "hue": [-0.1, 0.1]}, lambda: T.ColorJitter(0.4, 0.4, 0.2, 0.1)),
    ({"kind": "color_jitter", "brightness": [0.2, 1.8], "hue": [-0.5, 0.5]},
     lambda: T.ColorJitter(brightness=0.8, hue=0.5)),
    ({"kind": "random_grayscale", "p": 0.2}, lambda: T.RandomGrayscale(p=0.2)),
    ({"kind": "gaussian_blur", "kernel_size": [23, 23], "sigma": [0.1, 2.0]},
     lambda: T.GaussianBlur(23, sigma=(0.1, 2.0))),
    ({"kind": "gaussian_blur", "kernel_size": [5, 9], "sigma": [0.5, 0.5]},
     lambda: T.GaussianBlur((5, 9), sigma=0.5)),
    ({"kind": "random_solarize", "threshold": 128.0, "p": 0.2},
     lambda: T.RandomSolarize(128, p=0.2)),
    ({"kind": "random_posterize", "bits": 3, "p": 0.7}, lambda: T.RandomPosterize(3, p=0.7)),
    ({"kind": "random_equalize", "p": 0.5}, lambda: T.RandomEqualize()),
    ({"kind": "random_autocontrast", "p": 0.3}, lambda: T.RandomAutocontrast(p=0.3)),
    ({"kind": "random_adjust_sharpness", "sharpness_factor": 2.0, "p": 0.5},
     lambda: T.RandomAdjustSharpness(2)),
    ({"kind": "random_invert", "p": 0.1}, lambda: T.RandomInvert(p=0.1)),
    ({"kind": "random_vertical_flip", "p": 0.5}, lambda: T.RandomVerticalFlip()),
    ({"kind": "random_affine", "degrees": [-10.0, 10.0], "translate": [0.1, 0.2],
      "scale": [0.9, 1.1], "shear": [-5.0, 5.0, -3.0, 3.0], "interpolation": "bilinear",
      "fill": [1.0, 2.0, 3.0]},
     lambda: T.RandomAffine(10, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=(-5, 5, -3, 3),
                            interpolation=T.InterpolationMode.BILINEAR, fill=[1, 2, 3])),
    ({"kind": "random_affine", "degrees": [0.0, 30.0], "shear": [-8.0, 8.0, 0.0, 0.0],
      "center": [3.0, 5.0]},
     lambda: T.RandomAffine((0, 30), shear=8, center=(3, 5))),
    ({"kind": "random_rotation", "degrees": [-15.0, 15.0], "fill": [7.0, 7.0, 7.0]},
     lambda: T.RandomRotation(15, fill=7)),
    ({"kind": "random_apply", "p": 0.8, "ops": [
        {"kind": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4],
         "saturation": [0.8, 1.2], "hue": [-0.1, 0.1]}, {"kind": "random_grayscale", "p": 0.2}]},
     lambda: T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1), T.RandomGrayscale(0.2)], p=0.8)),
]

POLICIES = [
    ({"kind": "trivial_augment_wide"}, lambda: T.TrivialAugmentWide(), (64, 48)),
    ({"kind": "trivial_augment_wide", "num_magnitude_bins": 8, "interpolation": "bilinear",
      "fill": [9.0, 8.0, 7.0]},
     lambda: T.TrivialAugmentWide(8, interpolation=T.InterpolationMode.BILINEAR,
                                  fill=[9, 8, 7]), (50, 77)),
    ({"kind": "rand_augment"}, lambda: T.RandAugment(), (224, 176)),
    ({"kind": "rand_augment", "num_ops": 3, "magnitude": 4, "num_magnitude_bins": 11},
     lambda: T.RandAugment(3, 4, 11), (61, 96)),
    ({"kind": "auto_augment"}, lambda: T.AutoAugment(), (64, 64)),
    ({"kind": "auto_augment", "policy": "cifar10"},
     lambda: T.AutoAugment(T.AutoAugmentPolicy.CIFAR10), (32, 32)),
    ({"kind": "auto_augment", "policy": "svhn"},
     lambda: T.AutoAugment(T.AutoAugmentPolicy.SVHN), (40, 32)),
]


@pytest.mark.parametrize("op,make", RANDOM_OPS, ids=lambda v: v.get("kind")
                         if isinstance(v, dict) else "")
def test_random_operations_draw_as_torchvision(tool, op, make):
    size = (61, 90)
    ours = draw(tool, [op], size, seed=11, count=N)
    theirs = torchvision_draws(make(), size, seed=11, count=N)
    compare(ours, theirs)


@pytest.mark.parametrize("op,make,size", POLICIES, ids=lambda v: json.dumps(v)
                         if isinstance(v, dict) else "")
def test_policies_draw_as_torchvision(tool, op, make, size):
    """Which operation, with which magnitude bin and sign (the magnitudes are discrete: the
    whole step is the category), and for RandAugment and AutoAugment the whole sequence."""
    ours = draw(tool, [op], size, seed=5, count=N_POLICY)
    theirs = torchvision_draws(make(), size, seed=5, count=N_POLICY)
    compare(ours, theirs, continuous=False)
    if op["kind"] != "trivial_augment_wide":
        # Each step alone too: every operation and magnitude, pooled over the positions.
        known = _values(theirs)
        chi_square([_key([s], False, known) for steps in ours for s in steps],
                   [_key([s], False, known) for steps in theirs for s in steps],
                   "single steps")


def test_trivial_augment_picks_each_operation_and_bin_alike(tool):
    """TrivialAugmentWide's op choice is uniform over its 14 operations (Identity draws no
    step) and its magnitude bin uniform over num_magnitude_bins: checked on stoker's draws
    alone, against the uniform law, besides the comparison with torchvision above."""
    ours = draw(tool, [{"kind": "trivial_augment_wide"}], (64, 48), seed=21, count=N_POLICY)
    assert all(len(s) <= 1 for s in ours)
    kinds = Counter(s[0]["kind"] if s else "identity" for s in ours)
    # 14 operations: Identity, ShearX, ShearY, TranslateX, TranslateY (affine), Rotate,
    # Brightness, Color (saturation), Contrast, Sharpness, Posterize, Solarize, AutoContrast,
    # Equalize.
    expected = {"identity": 1, "affine": 4, "rotate": 1, "brightness": 1, "saturation": 1,
                "contrast": 1, "sharpness": 1, "posterize": 1, "solarize": 1, "autocontrast": 1,
                "equalize": 1}
    assert set(kinds) == set(expected), kinds
    obs = [kinds[k] for k in expected]
    exp = [N_POLICY * v / 14 for v in expected.values()]
    assert stats.chisquare(obs, exp).pvalue > ALPHA, kinds
    # Rotate's magnitude bins: |angle| = 135 * bin / 30, each bin alike.
    bins = Counter(round(abs(s[0]["angle"]) * 30 / 135) for s in ours
                   if s and s[0]["kind"] == "rotate")
    assert set(bins) <= set(range(31))
    obs = [bins[b] for b in range(31)]
    assert stats.chisquare(obs).pvalue > ALPHA, bins


def test_draws_are_the_same_for_a_seed_and_differ_across_seeds(tool):
    ops = [{"kind": "rand_augment"}, {"kind": "color_jitter", "brightness": [0.5, 1.5]}]
    a = draw(tool, ops, (32, 32), seed=3, count=50)
    assert a == draw(tool, ops, (32, 32), seed=3, count=50)
    assert a != draw(tool, ops, (32, 32), seed=4, count=50)



@pytest.mark.parametrize("op,make,continuous", [
    ({"kind": "random_grayscale", "p": 0.2}, lambda: T.RandomGrayscale(p=0.25), True),
    ({"kind": "color_jitter", "brightness": [0.6, 1.4]}, lambda: T.ColorJitter(0.45), True),
    ({"kind": "rand_augment", "magnitude": 9}, lambda: T.RandAugment(magnitude=8), False),
    ({"kind": "trivial_augment_wide", "num_magnitude_bins": 30},
     lambda: T.TrivialAugmentWide(31), False),
], ids=["p", "range", "magnitude", "bins"])
def test_the_comparison_tells_a_slightly_different_transform(tool, op, make, continuous):
    """The distribution tests have the power to fail: stoker's draws against torchvision's for
    slightly different parameters are told apart."""
    size = (61, 90)
    ours = draw(tool, [op], size, seed=11, count=N_POLICY)
    theirs = torchvision_draws(make(), size, seed=11, count=N_POLICY)
    with pytest.raises(AssertionError):
        compare(ours, theirs, continuous)
