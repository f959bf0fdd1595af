"""torchvision's transforms as a pipeline spec (issue 39, docs/python.md "Keep your
torchvision code"): `Loader(transform=T.Compose([...]))`, `views=[Compose, ...]` and
`batch_transform=T.MixUp(...)` are translated here into the spec's crop, flip, `ops`,
`erasing`, dtype, normalisation and `batch_mix`, before anything is sent.

torchvision is never imported: a transform is known by its class name and module
(`torchvision.transforms` v1 or `torchvision.transforms.v2`) and read through the attributes
torchvision stores after checking its arguments (ColorJitter's `brightness=0.4` is already the
range (0.6, 1.4) there). A subclass of a torchvision transform defined elsewhere is refused:
its `forward` may do anything. The spec's own spelling (dicts such as
`{"kind": "color_jitter", ...}`) is accepted wherever an operation is, so the same recipe can
be written without torchvision.

The order a Compose may have: one crop first (RandomResizedCrop, or Resize(side) then
CenterCrop); then the pixel operations in any order, with RandomHorizontalFlip anywhere among
them or before a RandomResizedCrop (stoker applies it with the crop: see docs/augment.md,
"The horizontal flip"); then the conversion (ToImage, PILToTensor and ToPureTensor do nothing;
ToTensor, ToDtype and ConvertImageDtype set the dtype); then Normalize; then RandomErasing.
"""

import json
from numbers import Integral, Real

from .errors import SpecError

# Class names this module translates, in the order a recipe lists them.
SUPPORTED = (
    "Compose", "RandomResizedCrop", "Resize", "CenterCrop", "RandomHorizontalFlip",
    "RandomVerticalFlip", "ColorJitter", "Grayscale", "RandomGrayscale", "GaussianBlur",
    "RandomSolarize", "RandomPosterize", "RandomEqualize", "RandomAutocontrast",
    "RandomAdjustSharpness", "RandomInvert", "RandomAffine", "RandomRotation", "RandomApply",
    "TrivialAugmentWide", "RandAugment", "AutoAugment", "ToImage", "PILToTensor",
    "ToPureTensor", "ToTensor",
    "ToDtype", "ConvertImageDtype", "Normalize", "RandomErasing",
)
# What batch_transform= translates.
SUPPORTED_BATCH = ("MixUp", "CutMix", "RandomChoice")

# The spec's operations (ipc/wire/src/spec/ops.rs, `Op`): kind -> (required, optional fields).
OP_FIELDS = {
    "color_jitter": ((), ("brightness", "contrast", "saturation", "hue")),
    "random_grayscale": (("p",), ()),
    "gaussian_blur": (("kernel_size",), ("sigma",)),
    "random_solarize": (("threshold",), ("p",)),
    "random_posterize": (("bits",), ("p",)),
    "random_equalize": ((), ("p",)),
    "random_autocontrast": ((), ("p",)),
    "random_adjust_sharpness": (("sharpness_factor",), ("p",)),
    "random_invert": ((), ("p",)),
    "random_vertical_flip": ((), ("p",)),
    "random_affine": (("degrees",), ("translate", "scale", "shear", "interpolation", "fill",
                                     "center")),
    "random_rotation": (("degrees",), ("interpolation", "fill", "center")),
    "random_apply": (("ops",), ("p",)),
    "trivial_augment_wide": ((), ("num_magnitude_bins", "interpolation", "fill")),
    "rand_augment": ((), ("num_ops", "magnitude", "num_magnitude_bins", "interpolation",
                          "fill")),
    "auto_augment": ((), ("policy", "interpolation", "fill")),
}
ERASING_FIELDS = ("p", "scale", "ratio", "value")
MIX_FIELDS = {"mix_up": (("num_classes",), ("alpha",)),
              "cut_mix": (("num_classes",), ("alpha",)),
              "choice": (("mixes",), ("p",))}
# torch dtypes by name -> the spec's dtype.
TORCH_DTYPES = {"torch.uint8": "u8", "torch.float16": "f16", "torch.bfloat16": "bf16",
                "torch.float32": "f32"}
# Most operations a view may list, RandomApply's included (spec/ops.rs MAX_OPS).
MAX_OPS = 64


def _supported_list():
    return ", ".join(SUPPORTED)


def _refuse(where, what, reason):
    raise SpecError(f"{where}: {what}: {reason}")


def _unsupported(where, name):
    raise SpecError(
        f"{where}: {name} is not supported by stoker; supported: {_supported_list()} "
        "(or the spec's own operations as dicts, docs/augment.md)")


def _tv_name(t):
    """The class name of a torchvision transform, or None for anything else."""
    cls = type(t)
    module = getattr(cls, "__module__", "") or ""
    if module.startswith("torchvision.transforms"):
        return cls.__name__
    return None


def _describe(t):
    name = _tv_name(t)
    if name is not None:
        return f"torchvision's {name}"
    cls = type(t)
    if cls.__name__ == "function" or cls.__name__ == "lambda":
        return f"the function {getattr(t, '__name__', t)!r}"
    return f"{cls.__module__}.{cls.__qualname__}"


def _num(v):
    return isinstance(v, Real) and not isinstance(v, bool)


def _pair_of(v):
    if v is None:
        return None
    v = list(v)
    return [float(v[0]), float(v[1])]


def _interpolation(where, name, mode):
    """torchvision's InterpolationMode (v1 or v2; or its value; or a PIL filter number) as the
    spec's "nearest" / "bilinear"."""
    value = getattr(mode, "value", mode)
    if isinstance(value, str) and value.lower() in ("nearest", "bilinear"):
        return value.lower()
    if isinstance(value, Integral) and not isinstance(value, bool) and value in (0, 2):
        return {0: "nearest", 2: "bilinear"}[int(value)]
    _refuse(where, name, f"interpolation must be NEAREST or BILINEAR (torchvision's tensor "
            f"kernels; stoker has those two), got {mode!r}")


def _bilinear(where, name, mode):
    """Refuses a resize that is not bilinear (stoker's is antialiased bilinear)."""
    value = getattr(mode, "value", mode)
    if not (value == 2 or (isinstance(value, str) and value.lower() == "bilinear")):
        _refuse(where, name, "interpolation must be BILINEAR (stoker's resize is antialiased "
                f"bilinear), got {mode!r}")


def _fill(where, name, fill):
    """An RGB fill in 0..255 from torchvision's `fill` (None, a number, a 1- or 3-sequence, or
    v2's {type: fill} with one value for every type)."""
    if isinstance(fill, dict):
        values = list(fill.values())
        if not values or any(v != values[0] for v in values):
            _refuse(where, name, f"fill must be one value for images, got {fill!r}")
        fill = values[0]
    if fill is None:
        return [0.0, 0.0, 0.0]
    if _num(fill):
        fill = [fill]
    try:
        fill = [float(v) for v in fill]
    except (TypeError, ValueError):
        _refuse(where, name, f"fill must be a number or 3 numbers (R, G, B), got {fill!r}")
    if len(fill) == 1:
        fill = fill * 3
    if len(fill) != 3 or not all(0 <= v <= 255 for v in fill):
        _refuse(where, name, f"fill must be a number or 3 numbers (R, G, B) within 0..255, "
                f"got {fill!r}")
    return fill


def _center(center):
    return None if center is None else [float(center[0]), float(center[1])]


def _flatten(transform, where):
    """[(where, item)] of a Compose, a list, a tuple or one transform, nested Composes (and
    lists) flattened; `where` names each item as the user wrote it."""
    name = _tv_name(transform)
    if name == "Compose":
        items = transform.transforms
    elif isinstance(transform, (list, tuple)):
        items = transform
    else:
        return [(where, transform)]
    out = []
    for i, t in enumerate(items):
        out.extend(_flatten(t, f"{where}[{i}]"))
    return out


def _p(t):
    return float(t.p)


def _op(where, t, name):
    """The spec operation (a dict) of a torchvision pixel transform `t` called `name`, or None
    when `name` is not one."""
    if name == "ColorJitter":
        op = {"kind": "color_jitter"}
        for field in ("brightness", "contrast", "saturation", "hue"):
            r = _pair_of(getattr(t, field))
            # torchvision keeps None for a factor that changes nothing; so does the spec.
            centre = 0.0 if field == "hue" else 1.0
            if r is not None and not r[0] == r[1] == centre:
                op[field] = r
        return op
    if name == "Grayscale":
        if t.num_output_channels != 3:
            _refuse(where, name, f"num_output_channels must be 3 (stoker's images keep three "
                    f"channels), got {t.num_output_channels}")
        return {"kind": "random_grayscale", "p": 1.0}
    if name == "RandomGrayscale":
        return {"kind": "random_grayscale", "p": _p(t)}
    if name == "GaussianBlur":
        ks = [int(k) for k in t.kernel_size]
        return {"kind": "gaussian_blur", "kernel_size": ks, "sigma": _pair_of(t.sigma)}
    if name == "RandomSolarize":
        return {"kind": "random_solarize", "threshold": float(t.threshold), "p": _p(t)}
    if name == "RandomPosterize":
        return {"kind": "random_posterize", "bits": int(t.bits), "p": _p(t)}
    if name in ("RandomEqualize", "RandomAutocontrast", "RandomInvert", "RandomVerticalFlip"):
        kind = {"RandomEqualize": "random_equalize", "RandomAutocontrast": "random_autocontrast",
                "RandomInvert": "random_invert", "RandomVerticalFlip": "random_vertical_flip"}
        return {"kind": kind[name], "p": _p(t)}
    if name == "RandomAdjustSharpness":
        return {"kind": "random_adjust_sharpness", "sharpness_factor": float(t.sharpness_factor),
                "p": _p(t)}
    if name == "RandomAffine":
        op = {"kind": "random_affine", "degrees": _pair_of(t.degrees)}
        if t.translate is not None:
            op["translate"] = _pair_of(t.translate)
        if t.scale is not None:
            op["scale"] = _pair_of(t.scale)
        if t.shear is not None:
            shear = [float(v) for v in t.shear]
            op["shear"] = shear + [0.0, 0.0] if len(shear) == 2 else shear
        op["interpolation"] = _interpolation(where, name, t.interpolation)
        op["fill"] = _fill(where, name, t.fill)
        if t.center is not None:
            op["center"] = _center(t.center)
        return op
    if name == "RandomRotation":
        if t.expand:
            _refuse(where, name, "expand=True changes the image's size per sample; stoker "
                    "supports expand=False only")
        op = {"kind": "random_rotation", "degrees": _pair_of(t.degrees),
              "interpolation": _interpolation(where, name, t.interpolation),
              "fill": _fill(where, name, t.fill)}
        if t.center is not None:
            op["center"] = _center(t.center)
        return op
    if name == "TrivialAugmentWide":
        return {"kind": "trivial_augment_wide", "num_magnitude_bins": int(t.num_magnitude_bins),
                "interpolation": _interpolation(where, name, t.interpolation),
                "fill": _fill(where, name, t.fill)}
    if name == "RandAugment":
        return {"kind": "rand_augment", "num_ops": int(t.num_ops),
                "magnitude": int(t.magnitude), "num_magnitude_bins": int(t.num_magnitude_bins),
                "interpolation": _interpolation(where, name, t.interpolation),
                "fill": _fill(where, name, t.fill)}
    if name == "AutoAugment":
        policy = getattr(t.policy, "value", t.policy)
        if policy not in ("imagenet", "cifar10", "svhn"):
            _refuse(where, name, f"policy must be IMAGENET, CIFAR10 or SVHN, got {t.policy!r}")
        return {"kind": "auto_augment", "policy": policy,
                "interpolation": _interpolation(where, name, t.interpolation),
                "fill": _fill(where, name, t.fill)}
    return None


def _geometric(op):
    return op["kind"] in ("random_affine", "random_rotation")


def _mirror_safe(where, op):
    """Refuses a RandomAffine / RandomRotation a horizontal flip follows when flipping first
    would change its distribution (an off-centre rotation, or a range that is not symmetric
    about 0): stoker flips with the crop, before the operations."""
    if op["kind"] == "random_apply":
        for inner in op["ops"]:
            _mirror_safe(where, inner)
        return
    if not _geometric(op):
        return
    name = "RandomAffine" if op["kind"] == "random_affine" else "RandomRotation"
    ranges = [op["degrees"]]
    shear = op.get("shear")
    if shear is not None:
        ranges += [shear[:2], shear[2:]]
    if op.get("center") is not None or any(lo != -hi for lo, hi in ranges):
        _refuse(where, name, "RandomHorizontalFlip comes after it, and stoker flips with the "
                "crop, before the operations: that is the same only for ranges symmetric "
                "about 0 and the image's centre; put the flip before it")


def _count(ops):
    return sum(1 + _count(op["ops"]) if op["kind"] == "random_apply" else 1 for op in ops)


def _ops_of(where, items):
    """Spec operations of RandomApply's transforms (pixel operations only)."""
    ops = []
    for w, t in items:
        if isinstance(t, dict):
            ops.append(check_op(w, t))
            continue
        name = _tv_name(t)
        if name is None:
            _unsupported(w, _describe(t))
        if name == "RandomApply":
            ops.append({"kind": "random_apply", "p": _p(t),
                        "ops": _ops_of(w, _flatten(list(t.transforms), w))})
            continue
        op = _op(w, t, name)
        if op is None:
            if name in SUPPORTED:
                _refuse(w, name, "RandomApply may hold pixel operations only (ColorJitter, "
                        "GaussianBlur, RandomAffine, ...), not crops, flips, conversions, "
                        "Normalize or RandomErasing")
            _unsupported(w, name)
        ops.append(op)
    return ops


def _dtype(where, name, dtype):
    if isinstance(dtype, dict):
        # v2's {tv_tensors.Image: torch.float32, "others": None}: the images' entry.
        image = [v for k, v in dtype.items() if getattr(k, "__name__", k) in ("Image", "others")
                 and v is not None]
        if not image:
            _refuse(where, name, f"dtype must name the images' dtype, got {dtype!r}")
        dtype = image[0]
    key = str(dtype)
    if key not in TORCH_DTYPES:
        _refuse(where, name, f"dtype must be torch.uint8, float16, bfloat16 or float32, "
                f"got {dtype!r}")
    return TORCH_DTYPES[key]


def _erasing_of(where, t):
    value = t.value
    if value is None or value == "random":
        value = "random"
    else:
        if _num(value):
            value = [value]
        value = [float(v) for v in value]
        if len(value) == 1:
            value = value * 3
        if len(value) != 3:
            _refuse(where, "RandomErasing", f"value must be a number, 3 numbers or 'random', "
                    f"got {t.value!r}")
    return {"p": _p(t), "scale": _pair_of(t.scale), "ratio": _pair_of(t.ratio), "value": value}


def translate(transform, where="transform"):
    """One view's recipe from a torchvision transform (a Compose, a list, or one transform;
    items may also be the spec's operation dicts): a dict with `crop` (the spec's crop),
    `flip_prob`, `ops`, `erasing` (or None), `dtype` (the spec's name), `mean` and `std` (or
    None when the transform has no Normalize). Raises SpecError naming the transform (and its
    place) that cannot be translated, and what is supported."""
    items = _flatten(transform, where)
    crop = None
    resize = None          # (where, side) of a Resize waiting for its CenterCrop
    flip = None            # (where, p)
    ops = []
    erasing = None
    dtype = None
    stage = "pixels"       # then "float" after a float conversion, "normalised" after Normalize
    mean = std = None
    for w, t in items:
        if isinstance(t, dict):
            if stage != "pixels":
                _refuse(w, f"operation {t.get('kind')!r}", "pixel operations come before the "
                        "conversion to float and Normalize")
            if crop is None:
                _refuse(w, f"operation {t.get('kind')!r}", "the crop comes first")
            ops.append(check_op(w, t))
            continue
        name = _tv_name(t)
        if name is None:
            _unsupported(w, _describe(t))
        if name in ("ToImage", "PILToTensor", "ToPureTensor"):
            continue
        if resize is not None and name != "CenterCrop":
            _refuse(resize[0], "Resize", "stoker's Resize is followed by a CenterCrop "
                    f"(Resize(side) + CenterCrop(size)); {name} follows it")
        if name == "RandomResizedCrop":
            if crop is not None or ops or stage != "pixels":
                _refuse(w, name, "the crop comes first, and there is one")
            _bilinear(w, name, t.interpolation)
            if getattr(t, "antialias", True) is False:
                _refuse(w, name, "antialias must be True (stoker's resize is antialiased)")
            size = [int(v) for v in t.size]
            crop = {"kind": "random_resized", "size": size, "scale": _pair_of(t.scale),
                    "ratio": _pair_of(t.ratio)}
            continue
        if name == "RandomHorizontalFlip" and crop is None and resize is None:
            # Before a RandomResizedCrop: the box's left edge is uniform over the positions,
            # and so is its mirror, so flipping first is the same as flipping after it.
            if flip is not None:
                _refuse(w, name, f"one horizontal flip per view (another at {flip[0]})")
            flip = (w, _p(t))
            continue
        if name == "Resize":
            if flip is not None and crop is None:
                _refuse(flip[0], "RandomHorizontalFlip", "a flip before Resize + CenterCrop "
                        "moves the centre crop by half a pixel where it cannot be centred; "
                        "put the flip after the crop")
            if crop is not None or ops or stage != "pixels":
                _refuse(w, name, "the crop comes first, and there is one")
            size = t.size if isinstance(t.size, (list, tuple)) else [t.size]
            if len(size) != 1 or getattr(t, "max_size", None) is not None:
                _refuse(w, name, f"size must be one side (the shorter side's length, no "
                        f"max_size), got size={t.size!r}")
            _bilinear(w, name, t.interpolation)
            resize = (w, int(size[0]))
            continue
        if name == "CenterCrop":
            if resize is None:
                _refuse(w, name, "stoker crops the centre of a resized image: put "
                        "Resize(side) right before CenterCrop (a CenterCrop of the image as "
                        "decoded has no fixed scale)")
            size = [int(v) for v in t.size]
            if resize[1] < min(size):
                _refuse(w, name, f"the Resize side ({resize[1]}) must be at least the crop's "
                        f"shorter side ({min(size)})")
            crop = {"kind": "center_crop", "size": size, "resize": resize[1]}
            resize = None
            continue
        if crop is None:
            _refuse(w, name, "the crop comes first: RandomResizedCrop, or Resize then "
                    "CenterCrop")
        if name == "RandomHorizontalFlip":
            if flip is not None:
                _refuse(w, name, f"one horizontal flip per view (another at {flip[0]})")
            for op in ops:
                _mirror_safe(w, op)
            flip = (w, _p(t))
            continue
        if name in ("ToTensor", "ToDtype", "ConvertImageDtype"):
            if stage == "normalised":
                _refuse(w, name, "the conversion comes before Normalize")
            if name == "ToTensor":
                got = "f32"
            else:
                got = _dtype(w, name, t.dtype)
                if name == "ToDtype" and got != "u8" and not t.scale:
                    _refuse(w, name, "scale must be True for a float dtype (stoker's float "
                            "output is the pixels / 255)")
            if dtype not in (None, "u8") and got != dtype:
                _refuse(w, name, f"converts the {dtype} image again, to {got}")
            dtype = got
            if got != "u8":
                stage = "float"
            continue
        if name == "Normalize":
            if stage != "float":
                _refuse(w, name, "a float image comes first: ToDtype(torch.float32, "
                        "scale=True) (or ToTensor) before Normalize" if stage == "pixels"
                        else "one Normalize per view")
            mean = [float(v) for v in t.mean]
            std = [float(v) for v in t.std]
            if len(mean) == 1:
                mean = mean * 3
            if len(std) == 1:
                std = std * 3
            if len(mean) != 3 or len(std) != 3:
                _refuse(w, name, f"mean and std must be 1 or 3 numbers, got {t.mean!r}, "
                        f"{t.std!r}")
            stage = "normalised"
            continue
        if name == "RandomErasing":
            if stage != "normalised":
                _refuse(w, name, "RandomErasing comes after Normalize (stoker erases the "
                        "normalised output)")
            if erasing is not None:
                _refuse(w, name, "one RandomErasing per view")
            erasing = _erasing_of(w, t)
            continue
        if name == "RandomApply":
            op = {"kind": "random_apply", "p": _p(t),
                  "ops": _ops_of(w, _flatten(list(t.transforms), w))}
        else:
            op = _op(w, t, name)
        if op is None:
            _unsupported(w, name)
        if stage != "pixels":
            _refuse(w, name, "pixel operations run on the 8-bit image: put it before the "
                    "conversion to float (ToDtype / ToTensor) and Normalize")
        ops.append(op)
    if resize is not None:
        _refuse(resize[0], "Resize", "stoker's Resize is followed by a CenterCrop "
                "(Resize(side) + CenterCrop(size))")
    if crop is None:
        _refuse(where, "the transform", "it has no crop: stoker's views start with "
                "RandomResizedCrop, or Resize then CenterCrop")
    if _count(ops) > MAX_OPS:
        _refuse(where, "the transform", f"at most {MAX_OPS} operations per view, RandomApply's "
                f"included, got {_count(ops)}")
    return {"crop": crop, "flip_prob": flip[1] if flip else 0.0, "ops": ops,
            "erasing": erasing, "dtype": dtype or "u8", "mean": mean, "std": std}


def is_transform(v):
    """Whether a `views=` entry is a transform to translate (a torchvision transform, or a
    list of transforms / operation dicts) rather than one of the view dicts of docs/views.md."""
    if _tv_name(v) is not None:
        return True
    if isinstance(v, (list, tuple)):
        return all(_tv_name(t) is not None or isinstance(t, (dict, list, tuple)) for t in v)
    return callable(v) and not isinstance(v, (dict, str))


# --- the spec's own spelling -----------------------------------------------------------------


def check_op(where, op):
    """A spec operation given as a dict (`{"kind": "color_jitter", ...}`), checked for its kind
    and field names (the daemon checks the values); RandomApply's operations too."""
    if not isinstance(op, dict) or "kind" not in op:
        _refuse(where, "operation", f"must be a dict with a 'kind' (one of "
                f"{', '.join(OP_FIELDS)}), got {op!r}")
    kind = op["kind"]
    if kind not in OP_FIELDS:
        _refuse(where, f"operation {kind!r}", f"kind must be one of {', '.join(OP_FIELDS)}")
    required, optional = OP_FIELDS[kind]
    missing = [f for f in required if f not in op]
    unknown = sorted(set(op) - set(required) - set(optional) - {"kind"})
    if missing:
        _refuse(where, f"operation {kind!r}", f"needs {', '.join(missing)}")
    if unknown:
        _refuse(where, f"operation {kind!r}", f"has no field {', '.join(unknown)} (it takes "
                f"{', '.join(required + optional) or 'none'})")
    out = dict(op)
    if kind == "random_apply":
        if not isinstance(op["ops"], (list, tuple)):
            _refuse(where, "operation 'random_apply'", f"ops must be a list, got {op['ops']!r}")
        out["ops"] = [check_op(f"{where}.ops[{i}]", o) for i, o in enumerate(op["ops"])]
    return out


def check_ops(where, ops):
    """`Loader(ops=[...])`: a list of spec operation dicts (or torchvision pixel transforms)."""
    if isinstance(ops, (dict, str)) or not isinstance(ops, (list, tuple)):
        _refuse(where, "ops", f"must be a list of operations, got {ops!r}")
    return _ops_of(where, [(f"{where}[{i}]", o) for i, o in enumerate(ops)])


def check_erasing(where, erasing):
    """`Loader(erasing={...})`: the spec's RandomErasing dict, or a torchvision RandomErasing."""
    if _tv_name(erasing) == "RandomErasing":
        return _erasing_of(where, erasing)
    if not isinstance(erasing, dict):
        _refuse(where, "erasing", f"must be a dict of {', '.join(ERASING_FIELDS)} (or a "
                f"RandomErasing), got {erasing!r}")
    unknown = sorted(set(erasing) - set(ERASING_FIELDS))
    if unknown:
        _refuse(where, "erasing", f"has no field {', '.join(unknown)} (it takes "
                f"{', '.join(ERASING_FIELDS)})")
    return dict(erasing)


def _mix_of(where, t):
    name = _tv_name(t)
    if name in ("MixUp", "CutMix"):
        if t.num_classes is None:
            _refuse(where, name, "num_classes must be given (the soft labels' width)")
        return {"kind": "mix_up" if name == "MixUp" else "cut_mix", "alpha": float(t.alpha),
                "num_classes": int(t.num_classes)}
    if name == "RandomChoice":
        mixes = [_mix_of(f"{where}[{i}]", m) for i, m in enumerate(t.transforms)]
        if any(m["kind"] == "choice" for m in mixes):
            _refuse(where, name, "a RandomChoice of MixUp and CutMix only")
        out = {"kind": "choice", "mixes": mixes}
        if t.p is not None:
            out["p"] = [float(v) for v in t.p]
        return out
    if isinstance(t, dict):
        return check_mix(where, t)
    if name is None:
        raise SpecError(f"{where}: {_describe(t)} is not supported by stoker as a batch "
                        f"transform; supported: {', '.join(SUPPORTED_BATCH)} (MixUp and CutMix)")
    raise SpecError(f"{where}: {name} is not supported by stoker as a batch transform; "
                    f"supported: {', '.join(SUPPORTED_BATCH)} (MixUp and CutMix)")


def translate_batch(transform, where="batch_transform"):
    """The spec's `batch_mix` dict of `T.MixUp(...)`, `T.CutMix(...)`, or
    `T.RandomChoice([...])` of them (or the spec's own dict, or its JSON)."""
    if isinstance(transform, str):
        try:
            transform = json.loads(transform)
        except ValueError as e:
            _refuse(where, "batch_mix", f"is not JSON: {e}")
    return _mix_of(where, transform)


def check_mix(where, mix):
    """`Loader(batch_mix={...})`: the spec's dict, checked for its kind and field names."""
    if not isinstance(mix, dict) or mix.get("kind") not in MIX_FIELDS:
        _refuse(where, "batch_mix", f"must be a dict with 'kind' one of "
                f"{', '.join(MIX_FIELDS)}, got {mix!r}")
    kind = mix["kind"]
    required, optional = MIX_FIELDS[kind]
    missing = [f for f in required if f not in mix]
    unknown = sorted(set(mix) - set(required) - set(optional) - {"kind"})
    if missing:
        _refuse(where, kind, f"needs {', '.join(missing)}")
    if unknown:
        _refuse(where, kind, f"has no field {', '.join(unknown)}")
    out = dict(mix)
    if kind == "choice":
        if not isinstance(mix["mixes"], (list, tuple)):
            _refuse(where, kind, f"mixes must be a list, got {mix['mixes']!r}")
        out["mixes"] = [_mix_of(f"{where}.mixes[{i}]", m) for i, m in enumerate(mix["mixes"])]
    return out
