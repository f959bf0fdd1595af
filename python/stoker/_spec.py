"""The pipeline spec a Loader sends: built from the Loader's arguments, and checked in the
user's terms (the argument's name and what it must be) before anything is sent, so that a typo
fails at `Loader(...)`, not as a JSON column number at the first batch."""

from numbers import Integral, Real

from . import _transforms
from .errors import SpecError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# libstoker's limits (ipc/wire/src/spec.rs: MAX_BATCH_SIZE, MAX_OUTPUT_SIDE).
MAX_BATCH_SIZE = 65_536
MAX_SIDE = 16_384
DTYPES = ("u8", "f16", "bf16", "f32")
# The names PyTorch and numpy users reach for first.
DTYPE_ALIASES = {"uint8": "u8", "float16": "f16", "half": "f16", "bfloat16": "bf16",
                 "float32": "f32", "float": "f32"}
LAYOUTS = ("nchw", "nhwc")
# Most views a spec may ask for (ipc/wire/src/spec.rs: MAX_VIEWS).
MAX_VIEWS = 16
# What one entry of Loader(views=[...]) may say; the Loader's own arguments fill the rest.
VIEW_KEYS = ("crop", "scale", "ratio", "flip_prob", "resize", "ops", "erasing")
# How a field's bytes are handed out (Loader(fields={name: mode})).
FIELD_MODES = ("bytes", "str", "json")


def _refuse(name, must, got):
    raise SpecError(f"Loader({name}=...): {must}, got {got!r}")


def _int(name, v, lo, hi):
    if isinstance(v, bool) or not isinstance(v, Integral) or not lo <= v <= hi:
        _refuse(name, f"must be a whole number from {lo} to {hi}", v)
    return int(v)


def _pair(name, v, lo, hi):
    """An int side or an (h, w) pair of them, as [h, w]."""
    if isinstance(v, Integral) and not isinstance(v, bool):
        v = (v, v)
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        _refuse(name, "must be a side in pixels or an (height, width) pair", v)
    return [_int(name, x, lo, hi) for x in v]


def _range(name, v):
    """A (low, high) pair of positive numbers with low <= high."""
    ok = (isinstance(v, (tuple, list)) and len(v) == 2
          and all(isinstance(x, Real) and not isinstance(x, bool) for x in v)
          and 0 < v[0] <= v[1])
    if not ok:
        _refuse(name, "must be a (low, high) pair of positive numbers with low <= high", v)
    return [float(v[0]), float(v[1])]


def _triple(name, v, nonzero=False):
    ok = (isinstance(v, (tuple, list)) and len(v) == 3
          and all(isinstance(x, Real) and not isinstance(x, bool) for x in v)
          and not (nonzero and any(x == 0 for x in v)))
    if not ok:
        _refuse(name, "must be 3 numbers (R, G, B)" + (", none of them 0" if nonzero else ""), v)
    return [float(x) for x in v]


def _dtype_name(v):
    """A dtype's name as the strings say it: `torch.bfloat16` is "bfloat16", numpy's
    `np.float16` or `np.dtype("uint8")` "float16" / "uint8"; a string stays as it is."""
    if isinstance(v, str):
        return v
    text = str(v)
    if text.startswith("torch."):
        return text[len("torch."):]
    return getattr(v, "__name__", text)


def _choice(name, v, choices, aliases=None):
    key = v.lower() if isinstance(v, str) else v
    key = (aliases or {}).get(key, key)
    if key not in choices:
        _refuse(name, f"must be one of {', '.join(choices)}", v)
    return key


def build_spec(batch_size, crop, *, train=True, resize=None, scale=(0.08, 1.0),
               ratio=(3 / 4, 4 / 3), flip_prob=None, mean=IMAGENET_MEAN, std=IMAGENET_STD,
               dtype="f32", layout="nchw", drop_last=False, epochs=None, shuffle=None,
               exif_orientation=False, fields=None, field_max_bytes=None, ops=None,
               erasing=None, batch_mix=None):
    """The pipeline spec (a dict, sent as JSON) for these settings; see docs/python.md.
    `flip_prob` defaults to 0.5 for training and 0 for evaluation (`train=False`), `shuffle`
    to True for training and False for evaluation. `ops` (a list of the spec's operation
    dicts, docs/augment.md), `erasing` (the spec's RandomErasing dict) and `batch_mix` (its
    MixUp / CutMix dict) are view 0's operations and the batch's mix, left out when None.
    Raises SpecError naming the argument."""
    crop_spec, flip = _view(train, "", crop, scale, ratio, flip_prob, resize)
    spec = {
        "batch_size": _int("batch_size", batch_size, 1, MAX_BATCH_SIZE),
        "crop": crop_spec,
        "flip_prob": flip,
        "mean": _triple("mean", mean),
        "std": _triple("std", std, nonzero=True),
        "dtype": _choice("dtype", _dtype_name(dtype), DTYPES, DTYPE_ALIASES),
        "layout": _choice("layout", layout, LAYOUTS),
        "drop_last": bool(drop_last),
        "shuffle": bool(train if shuffle is None else shuffle),
    }
    if epochs is not None:
        spec["epochs"] = _int("epochs", epochs, 1, 2**32 - 1)
    if not isinstance(exif_orientation, bool):
        _refuse("exif_orientation", "must be True or False", exif_orientation)
    if exif_orientation:
        # Sent only when on, so a daemon that predates the option serves the rest as before.
        spec["exif_orientation"] = True
    names = [name for name, _ in field_modes(fields)]
    if names:
        # Sent only when asked for, like exif_orientation. The names' rules are libstoker's.
        spec["fields"] = names
    if field_max_bytes is not None:
        spec["field_max_bytes"] = _int("field_max_bytes", field_max_bytes, 1, 2**32 - 1)
    # Sent only when given, like exif_orientation: a spec without them reads as before.
    if ops is not None:
        checked = _transforms.check_ops("Loader(ops=...)", ops)
        if checked:
            spec["ops"] = checked
    if erasing is not None:
        spec["erasing"] = _transforms.check_erasing("Loader(erasing=...)", erasing)
    if batch_mix is not None:
        spec["batch_mix"] = _transforms.translate_batch(batch_mix, "Loader(batch_mix=...)")
        _needs_float(spec, "batch_mix")
    return spec


def _needs_float(spec, name):
    if spec["dtype"] == "u8":
        raise SpecError(f"Loader({name}=...): MixUp / CutMix need a float output (their images "
                        "are blends), got dtype u8: add ToDtype(torch.float32, scale=True) to "
                        "the transform, or pass dtype='f32'")


def _recipe_into(out, recipe):
    """Writes one translated view (`_transforms.translate`) into a spec or a view dict."""
    out["crop"] = recipe["crop"]
    out["flip_prob"] = recipe["flip_prob"]
    if recipe["ops"]:
        out["ops"] = recipe["ops"]
    if recipe["erasing"] is not None:
        out["erasing"] = recipe["erasing"]


def _output_of(recipe):
    """(dtype, mean, std) a translated view asks of the spec: a float view without Normalize
    is the pixels / 255 (mean 0, std 1)."""
    if recipe["mean"] is not None:
        return recipe["dtype"], recipe["mean"], recipe["std"]
    return recipe["dtype"], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]


def with_transform(spec, transform, *, ops=None, erasing=None):
    """`spec` whose view 0 (crop, flip, operations, erasing) and output (dtype, mean, std) are
    those of a torchvision transform (`Loader(transform=...)`); see `_transforms.translate`."""
    if ops is not None or erasing is not None:
        raise SpecError("Loader(transform=...) gives the view's operations and erasing: "
                        "pass ops= and erasing= only without it")
    recipe = _transforms.translate(transform, "Loader(transform=...)")
    out = {k: v for k, v in spec.items() if k not in ("ops", "erasing")}
    _recipe_into(out, recipe)
    dtype, mean, std = _output_of(recipe)
    out["dtype"], out["mean"], out["std"] = dtype, _triple("mean", mean), _triple("std", std,
                                                                                  nonzero=True)
    return out


def with_batch_transform(spec, batch_transform, name="batch_transform"):
    """`spec` with the `batch_mix` of `Loader(batch_transform=T.MixUp(...))` (or CutMix, or a
    RandomChoice of them)."""
    out = dict(spec, batch_mix=_transforms.translate_batch(batch_transform, f"Loader({name}=...)"))
    _needs_float(out, name)
    return out


def _view(train, where, crop, scale, ratio, flip_prob, resize):
    """One view's (crop spec, flip probability); `where` prefixes the argument names an error
    gives (e.g. "views[2]." for an entry of Loader(views=...))."""
    size = _pair(f"{where}crop", crop, 1, MAX_SIDE)
    if train:
        crop_spec = {"kind": "random_resized", "size": size,
                     "scale": _range(f"{where}scale", scale),
                     "ratio": _range(f"{where}ratio", ratio)}
    else:
        smaller = min(size)
        side = resize if resize is not None else smaller * 256 // 224
        crop_spec = {"kind": "center_crop", "size": size,
                     "resize": _int(f"{where}resize", side, smaller, MAX_SIDE)}
    flip = flip_prob if flip_prob is not None else (0.5 if train else 0.0)
    if isinstance(flip, bool) or not isinstance(flip, Real) or not 0 <= flip <= 1:
        _refuse(f"{where}flip_prob", "must be a probability from 0 to 1", flip_prob)
    return crop_spec, float(flip)


def with_views(spec, views, *, train=True, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
               flip_prob=None, resize=None, ops=None, erasing=None):
    """`spec` with the views of `Loader(views=[...])` (docs/views.md): each entry a dict of
    `crop` (a side or (h, w), required), `scale`, `ratio`, `flip_prob`, `resize`, `ops` and
    `erasing`, the Loader's own arguments filling what it leaves out (or a bare side), or a
    torchvision transform (a Compose: its crop, flip, operations and erasing; every such entry
    must convert and normalise alike, which sets the spec's dtype, mean and std). The first is
    the spec's view 0, the others its `extra_views`."""
    if isinstance(views, (str, bytes, dict)) or not isinstance(views, (list, tuple)):
        _refuse("views", "must be a list of views (dicts such as {'crop': 96, "
                "'scale': (0.05, 0.4)})", views)
    if not 1 <= len(views) <= MAX_VIEWS:
        _refuse("views", f"must list 1 to {MAX_VIEWS} views", views)
    made = []
    output = None  # (where, (dtype, mean, std)) of the first translated entry
    for i, v in enumerate(views):
        if isinstance(v, Integral) and not isinstance(v, bool):
            v = {"crop": v}
        if not isinstance(v, dict) and _transforms.is_transform(v):
            recipe = _transforms.translate(v, f"Loader(views[{i}]=...)")
            view = {}
            _recipe_into(view, recipe)
            got = _output_of(recipe)
            if output is None:
                output = (i, got)
            elif got != output[1]:
                raise SpecError(
                    f"Loader(views[{i}]=...): every view converts and normalises alike (the "
                    f"spec has one dtype, mean and std): views[{output[0]}] gives dtype "
                    f"{output[1][0]}, mean {output[1][1]}, std {output[1][2]}; this one "
                    f"{got[0]}, {got[1]}, {got[2]}")
            made.append(view)
            continue
        if not isinstance(v, dict) or "crop" not in v:
            _refuse(f"views[{i}]", "must be a dict with at least 'crop' (or a torchvision "
                    "transform)", v)
        unknown = sorted(set(v) - set(VIEW_KEYS))
        if unknown:
            _refuse(f"views[{i}]", f"may say only {', '.join(VIEW_KEYS)}", unknown)
        crop, flip = _view(train, f"views[{i}].", v["crop"], v.get("scale", scale),
                           v.get("ratio", ratio), v.get("flip_prob", flip_prob),
                           v.get("resize", resize))
        view = {"crop": crop, "flip_prob": flip}
        view_ops = v.get("ops", ops)
        if view_ops is not None:
            checked = _transforms.check_ops(f"Loader(views[{i}].ops=...)", view_ops)
            if checked:
                view["ops"] = checked
        view_erasing = v.get("erasing", erasing)
        if view_erasing is not None:
            view["erasing"] = _transforms.check_erasing(f"Loader(views[{i}].erasing=...)",
                                                        view_erasing)
        made.append(view)
    out = {k: v for k, v in spec.items() if k not in ("ops", "erasing")}
    out.update(made[0])
    if len(made) > 1:
        out["extra_views"] = made[1:]
    if output is not None:
        dtype, mean, std = output[1]
        out["dtype"], out["mean"], out["std"] = dtype, _triple("mean", mean), _triple(
            "std", std, nonzero=True)
    return out


def field_modes(fields):
    """[(name, mode)] for `Loader(fields=...)`: a list of extensions (each served as bytes),
    or a dict {extension: "bytes" | "str" | "json"}."""
    if fields is None:
        return []
    must = "must be a list of extensions or a dict {extension: 'bytes' | 'str' | 'json'}"
    if isinstance(fields, (str, bytes)):
        _refuse("fields", must, fields)
    if isinstance(fields, dict):
        items = list(fields.items())
    elif isinstance(fields, (list, tuple)):
        items = [(name, "bytes") for name in fields]
    else:
        _refuse("fields", must, fields)
    for name, mode in items:
        if not isinstance(name, str):
            _refuse("fields", "names must be strings (extensions such as 'txt')", name)
        if mode not in FIELD_MODES:
            _refuse(f"fields[{name!r}]", "must be 'bytes', 'str' or 'json'", mode)
    return items
