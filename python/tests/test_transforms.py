"""torchvision's transforms as stoker's spec (issue 39 item 4, docs/python.md "Keep your
torchvision code"): `Loader(transform=T.Compose([...]))` (v2 and v1), `views=[Compose, ...]`,
`batch_transform=T.MixUp/CutMix/RandomChoice` (the spec's own names without torchvision:
test_transforms_spec.py). What cannot be translated is refused at
`Loader(...)`, before anything is sent, naming the transform and listing what is supported.
The recipes then run through a real stokerd (skipped without one)."""

import os

import numpy as np
import pytest

import stoker
from stoker._spec import build_spec, with_batch_transform, with_transform, with_views
from stoker._transforms import SUPPORTED
from test_transforms_spec import REFERENCE_MIX, REFERENCE_OPS, refused

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
RATIO = [3 / 4, 4 / 3]


def spec_of(transform, batch_transform=None):
    s = with_transform(build_spec(8, 224), transform)
    return with_batch_transform(s, batch_transform) if batch_transform is not None else s


# --- torchvision ----------------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
import torchvision.transforms as T1  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.transforms import v2 as T  # noqa: E402

# An existing folder: the Loader checks that its dataset path exists when it is made, before
# anything is served; these tests look only at the spec.
HERE = os.path.dirname(os.path.abspath(__file__))

REFERENCE_SPEC = {
    "crop": {"kind": "random_resized", "size": [176, 176], "scale": [0.08, 1.0],
             "ratio": RATIO},
    "flip_prob": 0.5,
    "ops": [{"kind": "trivial_augment_wide", "num_magnitude_bins": 31,
             "interpolation": "bilinear", "fill": [0.0, 0.0, 0.0]}],
    "dtype": "f32", "mean": list(MEAN), "std": list(STD),
    "erasing": {"p": 0.1, "scale": [0.02, 0.33], "ratio": [0.3, 3.3], "value": [0.0] * 3},
}


def reference_v2(num_classes=1000):
    """torchvision's classification reference (references/classification/presets.py,
    ClassificationPresetTrain with auto_augment="ta_wide", random_erase=0.1, v2), and its
    train.py's MixUp / CutMix choice."""
    transform = T.Compose([
        T.RandomResizedCrop(176, interpolation=T.InterpolationMode.BILINEAR, antialias=True),
        T.RandomHorizontalFlip(0.5),
        T.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR),
        T.PILToTensor(),
        T.ToDtype(torch.float, scale=True),
        T.Normalize(mean=MEAN, std=STD),
        T.RandomErasing(p=0.1),
        T.ToPureTensor(),
    ])
    mix = T.RandomChoice([T.MixUp(alpha=0.2, num_classes=num_classes),
                          T.CutMix(alpha=1.0, num_classes=num_classes)])
    return transform, mix


def reference_v1():
    return T1.Compose([
        T1.RandomResizedCrop(176, interpolation=T1.InterpolationMode.BILINEAR),
        T1.RandomHorizontalFlip(0.5),
        T1.TrivialAugmentWide(interpolation=T1.InterpolationMode.BILINEAR),
        T1.PILToTensor(),
        T1.ConvertImageDtype(torch.float),
        T1.Normalize(mean=MEAN, std=STD),
        T1.RandomErasing(p=0.1),
    ])


def test_the_classification_reference_translates_v2_and_v1():
    transform, mix = reference_v2()
    s = spec_of(transform, mix)
    for key, want in REFERENCE_SPEC.items():
        assert s[key] == want, key
    assert s["batch_mix"] == {"kind": "choice", "p": [0.5, 0.5], "mixes": [
        {"kind": "mix_up", "alpha": 0.2, "num_classes": 1000},
        {"kind": "cut_mix", "alpha": 1.0, "num_classes": 1000}]}
    s1 = spec_of(reference_v1())
    for key, want in REFERENCE_SPEC.items():
        assert s1[key] == want, key
    # Through the Loader: the same spec, the Loader's crop / dtype / mean arguments unused.
    ld = stoker.Loader(HERE, autostart=False, transform=transform,
                       batch_transform=mix)
    assert ld.spec == dict(s, batch_size=64)
    # A single transform list is a Compose too; the flip may follow the pixel operations.
    s2 = spec_of([T.RandomResizedCrop(176),
                  T.TrivialAugmentWide(interpolation=T.InterpolationMode.BILINEAR),
                  T.RandomHorizontalFlip(), T.ToImage(), T.ToDtype(torch.float32, scale=True),
                  T.Normalize(MEAN, STD), T.RandomErasing(0.1)])
    assert {k: s2[k] for k in REFERENCE_SPEC} == REFERENCE_SPEC
    # ... or come before a RandomResizedCrop.
    s3 = spec_of([T.RandomHorizontalFlip(0.3), T.RandomResizedCrop(176), T.ToImage()])
    assert s3["flip_prob"] == 0.3 and s3["crop"] == REFERENCE_SPEC["crop"]


def dino_v2():
    """DINO's DataAugmentationDINO (main_dino.py) in torchvision v2: 2 global views of 224, 6
    local views of 96, each with its own colour operations."""
    flip_and_color_jitter = T.Compose([
        T.RandomHorizontalFlip(p=0.5),
        T.RandomApply([T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)],
                      p=0.8),
        T.RandomGrayscale(p=0.2),
    ])
    normalize = T.Compose([T.ToImage(), T.ToDtype(torch.float32, scale=True),
                           T.Normalize(MEAN, STD)])
    global1 = T.Compose([T.RandomResizedCrop(224, scale=(0.4, 1.0)), flip_and_color_jitter,
                         T.GaussianBlur(23, sigma=(0.1, 2.0)), normalize])
    global2 = T.Compose([T.RandomResizedCrop(224, scale=(0.4, 1.0)), flip_and_color_jitter,
                         T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.1),
                         T.RandomSolarize(128, p=0.2), normalize])
    local = T.Compose([T.RandomResizedCrop(96, scale=(0.05, 0.4)), flip_and_color_jitter,
                       T.RandomApply([T.GaussianBlur(23, sigma=(0.1, 2.0))], p=0.5), normalize])
    return [global1, global2] + [local] * 6


JITTER = {"kind": "random_apply", "p": 0.8, "ops": [
    {"kind": "color_jitter", "brightness": [0.6, 1.4], "contrast": [0.6, 1.4],
     "saturation": [0.8, 1.2], "hue": [-0.1, 0.1]}]}
GRAY = {"kind": "random_grayscale", "p": 0.2}
BLUR = {"kind": "gaussian_blur", "kernel_size": [23, 23], "sigma": [0.1, 2.0]}


def test_dino_views_translate_one_compose_per_view():
    s = with_views(build_spec(8, 224), dino_v2())
    assert s["crop"] == {"kind": "random_resized", "size": [224, 224], "scale": [0.4, 1.0],
                         "ratio": RATIO}
    assert s["flip_prob"] == 0.5 and s["ops"] == [JITTER, GRAY, BLUR]
    assert (s["dtype"], s["mean"], s["std"]) == ("f32", list(MEAN), list(STD))
    views = s["extra_views"]
    assert len(views) == 7
    assert views[0]["ops"] == [JITTER, GRAY, {"kind": "random_apply", "p": 0.1, "ops": [BLUR]},
                               {"kind": "random_solarize", "threshold": 128.0, "p": 0.2}]
    for v in views[1:]:
        assert v["crop"]["size"] == [96, 96] and v["crop"]["scale"] == [0.05, 0.4]
        assert v["ops"] == [JITTER, GRAY, {"kind": "random_apply", "p": 0.5, "ops": [BLUR]}]
        assert "erasing" not in v
    ld = stoker.Loader(HERE, autostart=False, views=dino_v2())
    assert ld.spec["extra_views"] == views and ld._views


def test_each_transform_translates_with_torchvisions_parameters():
    def ops(*ts, module=T):
        return spec_of([module.RandomResizedCrop(32), *ts]).get("ops", [])

    # ColorJitter: scalars become torchvision's ranges; a factor that changes nothing is left out.
    assert ops(T.ColorJitter(0.4, 0, (0.5, 1.5), 0.25)) == [
        {"kind": "color_jitter", "brightness": [0.6, 1.4], "saturation": [0.5, 1.5],
         "hue": [-0.25, 0.25]}]
    assert ops(T1.ColorJitter(brightness=1.5), module=T1) == [
        {"kind": "color_jitter", "brightness": [0.0, 2.5]}]
    assert ops(T.ColorJitter(contrast=(1, 1), hue=(0, 0))) == [{"kind": "color_jitter"}]
    assert ops(T.Grayscale(3), T1.RandomGrayscale(0.3)) == [
        {"kind": "random_grayscale", "p": 1.0}, {"kind": "random_grayscale", "p": 0.3}]
    assert ops(T.GaussianBlur(5), T1.GaussianBlur((3, 7), sigma=1.5)) == [
        {"kind": "gaussian_blur", "kernel_size": [5, 5], "sigma": [0.1, 2.0]},
        {"kind": "gaussian_blur", "kernel_size": [3, 7], "sigma": [1.5, 1.5]}]
    assert ops(T.RandomSolarize(200.5), T.RandomPosterize(3, p=0.25), T.RandomEqualize(0.1),
               T.RandomAutocontrast(), T.RandomAdjustSharpness(2, p=0.4), T.RandomInvert(0.2),
               T1.RandomVerticalFlip(0.3)) == [
        {"kind": "random_solarize", "threshold": 200.5, "p": 0.5},
        {"kind": "random_posterize", "bits": 3, "p": 0.25},
        {"kind": "random_equalize", "p": 0.1}, {"kind": "random_autocontrast", "p": 0.5},
        {"kind": "random_adjust_sharpness", "sharpness_factor": 2.0, "p": 0.4},
        {"kind": "random_invert", "p": 0.2}, {"kind": "random_vertical_flip", "p": 0.3}]
    assert ops(T.RandomAffine(10, translate=(0.1, 0.2), scale=(0.9, 1.1), shear=5,
                              fill=(1, 2, 3)),
               T1.RandomAffine((-5, 20), shear=(1, 2, 3, 4), fill=9,
                               interpolation=T1.InterpolationMode.BILINEAR, center=(4, 5)),
               module=T) == [
        {"kind": "random_affine", "degrees": [-10.0, 10.0], "translate": [0.1, 0.2],
         "scale": [0.9, 1.1], "shear": [-5.0, 5.0, 0.0, 0.0], "interpolation": "nearest",
         "fill": [1.0, 2.0, 3.0]},
        {"kind": "random_affine", "degrees": [-5.0, 20.0], "shear": [1.0, 2.0, 3.0, 4.0],
         "interpolation": "bilinear", "fill": [9.0, 9.0, 9.0], "center": [4.0, 5.0]}]
    assert ops(T.RandomRotation(15, fill=[10, 20, 30]),
               T1.RandomRotation((0, 90), interpolation=T1.InterpolationMode.BILINEAR)) == [
        {"kind": "random_rotation", "degrees": [-15.0, 15.0], "interpolation": "nearest",
         "fill": [10.0, 20.0, 30.0]},
        {"kind": "random_rotation", "degrees": [0.0, 90.0], "interpolation": "bilinear",
         "fill": [0.0, 0.0, 0.0]}]
    assert ops(T.RandAugment(3, 5, 21), T1.AutoAugment(T1.AutoAugmentPolicy.SVHN)) == [
        {"kind": "rand_augment", "num_ops": 3, "magnitude": 5, "num_magnitude_bins": 21,
         "interpolation": "nearest", "fill": [0.0, 0.0, 0.0]},
        {"kind": "auto_augment", "policy": "svhn", "interpolation": "nearest",
         "fill": [0.0, 0.0, 0.0]}]
    nested = ops(T.RandomApply([T.RandomApply([T.RandomInvert(1)], p=0.3),
                                {"kind": "random_equalize", "p": 1}], p=0.6))
    assert nested == [{"kind": "random_apply", "p": 0.6, "ops": [
        {"kind": "random_apply", "p": 0.3, "ops": [{"kind": "random_invert", "p": 1.0}]},
        {"kind": "random_equalize", "p": 1}]}]


def test_crops_conversions_and_erasing_translate():
    s = spec_of(T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor(),
                           T.ToDtype(torch.float16, scale=True), T.Normalize([0.5], [0.25])]))
    assert s["crop"] == {"kind": "center_crop", "size": [224, 224], "resize": 256}
    assert (s["flip_prob"], s["dtype"], s["mean"], s["std"]) == (0.0, "f16", [0.5] * 3,
                                                                [0.25] * 3)
    assert "ops" not in s and "erasing" not in s
    s = spec_of(T1.Compose([T1.Resize(80), T1.CenterCrop((64, 72)), T1.ToTensor()]))
    assert s["crop"] == {"kind": "center_crop", "size": [64, 72], "resize": 80}
    assert (s["dtype"], s["mean"], s["std"]) == ("f32", [0.0] * 3, [1.0] * 3)
    s = spec_of([T.RandomResizedCrop((48, 64), scale=(0.2, 0.9), ratio=(0.5, 2)), T.ToImage()])
    assert s["crop"] == {"kind": "random_resized", "size": [48, 64], "scale": [0.2, 0.9],
                         "ratio": [0.5, 2.0]}
    assert s["dtype"] == "u8" and s["flip_prob"] == 0.0
    s = spec_of([T.RandomResizedCrop(8), T.ToDtype({tv_tensors.Image: torch.bfloat16,
                                                    "others": None}, scale=True)])
    assert s["dtype"] == "bf16"
    norm = [T.RandomResizedCrop(8), T.ToImage(), T.ToDtype(torch.float32, scale=True),
            T.Normalize(MEAN, STD)]
    for erasing, value in ((T.RandomErasing(0.3, value=1.5), [1.5] * 3),
                           (T.RandomErasing(value=(1, 2, 3)), [1.0, 2.0, 3.0]),
                           (T.RandomErasing(value="random"), "random"),
                           (T1.RandomErasing(value="random"), "random"),
                           (T1.RandomErasing(scale=(0.1, 0.2), ratio=(1, 2), value=(4, 5, 6)),
                            [4.0, 5.0, 6.0])):
        got = spec_of(norm + [erasing])["erasing"]
        assert got["value"] == value and got["p"] == erasing.p
        assert got["scale"] == list(erasing.scale) and got["ratio"] == list(erasing.ratio)


def test_batch_transforms_translate():
    assert spec_of([T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True)],
                   T.MixUp(num_classes=7))["batch_mix"] == {"kind": "mix_up", "alpha": 1.0,
                                                            "num_classes": 7}
    assert spec_of([T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True)],
                   T.CutMix(alpha=0.5, num_classes=7))["batch_mix"] == {
        "kind": "cut_mix", "alpha": 0.5, "num_classes": 7}
    got = spec_of([T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True)],
                  T.RandomChoice([T.MixUp(num_classes=7), T.CutMix(num_classes=7)], p=[1, 3]))
    assert got["batch_mix"] == {"kind": "choice", "p": [0.25, 0.75], "mixes": [
        {"kind": "mix_up", "alpha": 1.0, "num_classes": 7},
        {"kind": "cut_mix", "alpha": 1.0, "num_classes": 7}]}


class MyJitter(T.ColorJitter):
    """A user's subclass: its forward may do anything, so it is not translated."""


REFUSALS = [
    (lambda: [T.RandomResizedCrop(8), T.ElasticTransform()], "\\[1\\]: ElasticTransform is not "
     "supported by stoker; supported: Compose, RandomResizedCrop"),
    (lambda: [T.RandomResizedCrop(8), T.Lambda(lambda x: x)], "Lambda is not supported"),
    (lambda: [T.RandomResizedCrop(8), MyJitter(0.4)], "test_transforms.MyJitter is not "
     "supported"),
    (lambda: [T.RandomResizedCrop(8), lambda x: x], "function '<lambda>' is not supported"),
    (lambda: T.Compose([T.RandomResizedCrop(8), T.RandomChoice([T.RandomInvert()])]),
     "RandomChoice is not supported"),
    (lambda: [T.ColorJitter(0.4), T.RandomResizedCrop(8)], "\\[0\\]: ColorJitter: the crop "
     "comes first"),
    (lambda: [T.CenterCrop(8)], "CenterCrop: .*put Resize\\(side\\) right before"),
    (lambda: [T.Resize(8)], "Resize: stoker's Resize is followed by a CenterCrop"),
    (lambda: [T.Resize((8, 9)), T.CenterCrop(8)], "Resize: size must be one side"),
    (lambda: [T.Resize(6), T.CenterCrop(8)], "the Resize side \\(6\\) must be at least"),
    (lambda: [T.RandomResizedCrop(8, interpolation=T.InterpolationMode.BICUBIC)],
     "RandomResizedCrop: interpolation must be BILINEAR"),
    (lambda: [T.RandomResizedCrop(8), T.RandomResizedCrop(8)], "the crop comes first, and "
     "there is one"),
    (lambda: [T.RandomResizedCrop(8), T.Grayscale()], "num_output_channels must be 3"),
    (lambda: [T.RandomResizedCrop(8), T.RandomRotation(10, expand=True)], "expand=False only"),
    (lambda: [T.RandomResizedCrop(8), T.RandomRotation(
        10, interpolation=T.InterpolationMode.BICUBIC)], "NEAREST or BILINEAR"),
    (lambda: [T.RandomResizedCrop(8), T.RandomRotation(10, fill=(1, 2))],
     "fill must be a number or 3 numbers"),
    (lambda: [T.RandomResizedCrop(8), T.RandomRotation((0, 10)), T.RandomHorizontalFlip()],
     "RandomRotation: RandomHorizontalFlip comes after it"),
    (lambda: [T.RandomResizedCrop(8), T.RandomAffine(10, center=(1, 1)),
              T.RandomHorizontalFlip()], "RandomAffine: RandomHorizontalFlip comes after"),
    (lambda: [T.RandomResizedCrop(8), T.RandomHorizontalFlip(), T.RandomHorizontalFlip()],
     "one horizontal flip per view"),
    (lambda: [T.RandomResizedCrop(8), T.Normalize(MEAN, STD)], "Normalize: a float image "
     "comes first"),
    (lambda: [T.RandomResizedCrop(8), T.ToDtype(torch.float32)], "scale must be True"),
    (lambda: [T.RandomResizedCrop(8), T.ToDtype(torch.float64, scale=True)],
     "dtype must be torch.uint8"),
    (lambda: [T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True), T.RandomInvert()],
     "RandomInvert: pixel operations run on the 8-bit image"),
    (lambda: [T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True), T.RandomErasing()],
     "RandomErasing comes after Normalize"),
    (lambda: [T.RandomResizedCrop(8), T.ToDtype(torch.float32, scale=True),
              T.Normalize(MEAN, STD), T.RandomErasing(), T.RandomErasing()],
     "one RandomErasing per view"),
    (lambda: [T.RandomResizedCrop(8), T.RandomApply([T.RandomHorizontalFlip()])],
     "RandomApply may hold pixel operations only"),
    (lambda: [T.ToImage()], "it has no crop"),
    (lambda: [T.RandomHorizontalFlip(), T.Resize(8), T.CenterCrop(8)],
     "\\[0\\]: RandomHorizontalFlip: a flip before Resize \\+ CenterCrop"),
    (lambda: [T.RandomHorizontalFlip(), T.RandomHorizontalFlip(), T.RandomResizedCrop(8)],
     "one horizontal flip per view"),
]


@pytest.mark.parametrize("make,match", REFUSALS)
def test_what_cannot_be_translated_is_refused_at_the_loader(make, match):
    msg = refused(match, transform=make())
    assert msg.startswith("Loader(transform=...)"), msg


def test_the_refusal_lists_what_is_supported():
    msg = refused("ElasticTransform", transform=T.Compose([T.RandomResizedCrop(8),
                                                           T.ElasticTransform()]))
    for name in SUPPORTED:
        assert name in msg, name


def test_refusals_of_views_and_batch_transforms_name_them():
    dino = dino_v2()
    dino[3] = T.Compose([T.RandomResizedCrop(96), T.ToImage(),
                         T.ToDtype(torch.float32, scale=True)])
    msg = refused("views\\[3\\]=...\\): every view converts and normalises alike", views=dino)
    assert "views[0] gives dtype f32" in msg
    refused("views\\[1\\]=...\\)\\[1\\]: ElasticTransform is not supported",
            views=[dino[0], [T.RandomResizedCrop(8), T.ElasticTransform()]])
    refused("transform=...\\) is one view's transform", transform=dino[0], views=dino)
    transform, _ = reference_v2()
    refused("batch_transform=...\\): RandomErasing is not supported by stoker as a batch "
            "transform; supported: MixUp, CutMix, RandomChoice",
            transform=transform, batch_transform=T.RandomErasing())
    refused("batch_transform=...\\): MixUp: num_classes must be given",
            transform=transform, batch_transform=T.MixUp())
    refused("batch_transform=...\\): MixUp / CutMix need a float output",
            transform=[T.RandomResizedCrop(8)], batch_transform=T.MixUp(num_classes=3))
    refused("batch_transform=...\\) and batch_mix= say the same", transform=transform,
            batch_transform=T.MixUp(num_classes=3), batch_mix=REFERENCE_MIX)
    refused("gives the view's operations and erasing", transform=transform, ops=REFERENCE_OPS)
    refused("transform=...\\) gives the crop, flip, dtype and normalisation; leave out "
            "crop=176, dtype='bf16'", transform=transform, crop=176, dtype="bf16")
    # The Loader's defaults, given as they are, are not a clash.
    stoker.Loader(HERE, autostart=False, transform=transform, crop=224,
                  mean=stoker.IMAGENET_MEAN, scale=[0.08, 1.0])


# --- through stokerd ------------------------------------------------------------------------


def _first_batch(ld):
    b = ld.next_batch()
    images = [np.array(np.from_dlpack(t), copy=True) for t in b.views] if ld._views else \
        [np.array(np.from_dlpack(b.images), copy=True)]
    return images, np.array(np.from_dlpack(b.labels), copy=True)


def test_the_reference_recipe_and_dino_run_through_the_loader(dataset, daemon):
    """The classification reference with its MixUp / CutMix choice, and the DINO views, each
    twice with one seed: the same bytes; the reference's labels are soft, one row per sample
    summing to 1."""
    transform, mix = reference_v2(num_classes=3)
    runs = []
    for job in ("tv-ref-a", "tv-ref-b"):
        with stoker.Loader(dataset, batch_size=4, transform=transform, batch_transform=mix,
                           seed=9, socket=daemon, autostart=False, job=job, epochs=1,
                           shuffle=False) as ld:
            it = iter(ld)
            images, soft = next(it)
            images = np.array(np.from_dlpack(images), copy=True)
            soft = np.array(np.from_dlpack(soft), copy=True)
            del it
            runs.append((images, soft))
    images, soft = runs[0]
    assert images.shape == (4, 3, 176, 176) and images.dtype == np.float32
    assert soft.shape == (4, 3) and soft.dtype == np.float32
    assert np.allclose(soft.sum(axis=1), 1, atol=1e-5)
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    runs = []
    for job in ("tv-dino-a", "tv-dino-b"):
        with stoker.Loader(dataset, batch_size=4, views=dino_v2(), seed=9, socket=daemon,
                           autostart=False, job=job, epochs=1, shuffle=False) as ld:
            runs.append(_first_batch(ld))
    views, _ = runs[0]
    assert [v.shape for v in views] == [(4, 3, 224, 224)] * 2 + [(4, 3, 96, 96)] * 6
    assert all(np.array_equal(a, b) for a, b in zip(runs[0][0], runs[1][0]))


def test_every_translated_operation_is_served(dataset, daemon):
    """A Compose with every operation the translation knows (v2 and v1 classes mixed), and
    erasing with a random value: the daemon accepts the spec as translated and serves it; the
    same twice with one seed."""
    transform = [
        T.RandomResizedCrop(40, scale=(0.3, 1)), T.RandomHorizontalFlip(),
        T.ColorJitter(0.4, 0.4, 0.2, 0.1), T1.RandomGrayscale(0.3), T.Grayscale(3),
        T.GaussianBlur((3, 5), sigma=(0.5, 1.5)), T.RandomSolarize(100), T.RandomPosterize(4),
        T.RandomEqualize(), T1.RandomAutocontrast(), T.RandomAdjustSharpness(2), T.RandomInvert(),
        T.RandomVerticalFlip(), T.RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1),
                                               shear=(-3, 3, -2, 2), fill=(1, 2, 3)),
        T1.RandomRotation(20, interpolation=T1.InterpolationMode.BILINEAR, fill=5,
                          center=(3, 4)),
        T.RandomApply([T.ColorJitter(hue=0.3), T.RandomApply([T.RandomInvert(1)])], p=0.7),
        T.TrivialAugmentWide(), T.RandAugment(3, 5), T.AutoAugment(T.AutoAugmentPolicy.SVHN),
        T.ToImage(), T.ToDtype(torch.float16, scale=True), T.Normalize(MEAN, STD),
        T.RandomErasing(0.5, value="random")]
    runs = []
    for job in ("tv-all-a", "tv-all-b"):
        with stoker.Loader(dataset, batch_size=4, transform=transform, seed=2, socket=daemon,
                           autostart=False, job=job, epochs=1, shuffle=False) as ld:
            runs.append(_first_batch(ld))
    (images,), _ = runs[0]
    assert images.shape == (4, 3, 40, 40) and images.dtype == np.float16
    assert np.isfinite(images).all()
    assert np.array_equal(images, runs[1][0][0])


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """An ImageFolder of 32 flat grey JPEGs (every pixel 200 after decoding and resizing), so
    an erased box of 0 shows exactly."""
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("flat") / "images"
    for c in range(2):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(16):
            Image.new("RGB", (30 + 7 * i, 90 - 3 * i), (200, 200, 200)).save(
                root / f"c{c}" / f"{i:03}.jpg", quality=95)
    return root


def test_erasing_draws_its_boxes_as_torchvision(flat, daemon):
    """RandomErasing through the daemon: the boxes of 1280 samples (found as the zeros of a
    flat grey u8 output) against torchvision's RandomErasing.get_params at the same output
    size: how often it applies (chi-square), the box's height, width, top and left (two-sample
    KS), at fixed seeds, failing below p = 0.001."""
    stats = pytest.importorskip("scipy.stats")
    h, w, p, scale, ratio = 24, 40, 0.6, (0.02, 0.33), (0.3, 3.3)
    erasing = {"p": p, "scale": list(scale), "ratio": list(ratio), "value": [0.0, 0.0, 0.0]}
    ours = []
    with stoker.Loader(flat, batch_size=32, crop=(h, w), dtype="u8", flip_prob=0.0, epochs=40,
                       seed=4, socket=daemon, autostart=False, job="tv-erasing",
                       erasing=erasing) as ld:
        for b in ld.batches():
            images = np.from_dlpack(b.images)
            assert images.shape[1:] == (3, h, w)
            for img in images:
                zero = (img == 0).all(axis=0)
                assert ((img == 200) | zero[None]).all(), "flat grey, or erased"
                if not zero.any():
                    ours.append(None)
                    continue
                rows, cols = np.flatnonzero(zero.any(axis=1)), np.flatnonzero(zero.any(axis=0))
                box = (rows[0], cols[0], len(rows), len(cols))
                assert zero.sum() == box[2] * box[3], "one rectangle"
                ours.append(box)
            del images, b
    assert len(ours) == 1280
    torch.manual_seed(4)
    img = torch.zeros(3, h, w)
    theirs = []
    for _ in range(len(ours)):
        if torch.rand(1) >= p:
            theirs.append(None)
            continue
        i, j, bh, bw, _ = T1.RandomErasing.get_params(img, scale=scale, ratio=ratio, value=[0])
        theirs.append((i, j, bh, bw) if (bh, bw) != (h, w) else None)
    erased = [sum(b is not None for b in s) for s in (ours, theirs)]
    table = np.array([erased, [len(ours) - erased[0], len(theirs) - erased[1]]])
    assert stats.chi2_contingency(table)[1] > 1e-3, f"erased {erased[0]} vs {erased[1]}"
    for k, name in enumerate(("top", "left", "height", "width")):
        a = [b[k] for b in ours if b is not None]
        t = [b[k] for b in theirs if b is not None]
        pv = stats.ks_2samp(a, t).pvalue
        assert pv > 1e-3, f"{name}: KS p = {pv:.2e}, stoker {np.percentile(a, [5, 50, 95])}, " \
                          f"torchvision {np.percentile(t, [5, 50, 95])}"
