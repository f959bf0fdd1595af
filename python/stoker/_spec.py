"""The pipeline spec a Loader sends: built from the Loader's arguments, and checked in the
user's terms (the argument's name and what it must be) before anything is sent, so that a typo
fails at `Loader(...)`, not as a JSON column number at the first batch."""

from numbers import Integral, Real

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
VIEW_KEYS = ("crop", "scale", "ratio", "flip_prob", "resize")
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
               exif_orientation=False, fields=None, field_max_bytes=None):
    """The pipeline spec (a dict, sent as JSON) for these settings; see docs/python.md.
    `flip_prob` defaults to 0.5 for training and 0 for evaluation (`train=False`), `shuffle`
    to True for training and False for evaluation. Raises SpecError naming the argument."""
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
    return spec


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
               flip_prob=None, resize=None):
    """`spec` with the views of `Loader(views=[...])` (docs/views.md): each entry a dict of
    `crop` (a side or (h, w), required), `scale`, `ratio`, `flip_prob` and `resize`, the
    Loader's own arguments filling what it leaves out (or a bare side). The first is the
    spec's `crop` and `flip_prob`, the others its `extra_views`."""
    if isinstance(views, (str, bytes, dict)) or not isinstance(views, (list, tuple)):
        _refuse("views", "must be a list of views (dicts such as {'crop': 96, "
                "'scale': (0.05, 0.4)})", views)
    if not 1 <= len(views) <= MAX_VIEWS:
        _refuse("views", f"must list 1 to {MAX_VIEWS} views", views)
    made = []
    for i, v in enumerate(views):
        if isinstance(v, Integral) and not isinstance(v, bool):
            v = {"crop": v}
        if not isinstance(v, dict) or "crop" not in v:
            _refuse(f"views[{i}]", "must be a dict with at least 'crop'", v)
        unknown = sorted(set(v) - set(VIEW_KEYS))
        if unknown:
            _refuse(f"views[{i}]", f"may say only {', '.join(VIEW_KEYS)}", unknown)
        made.append(_view(train, f"views[{i}].", v["crop"], v.get("scale", scale),
                          v.get("ratio", ratio), v.get("flip_prob", flip_prob),
                          v.get("resize", resize)))
    out = dict(spec, crop=made[0][0], flip_prob=made[0][1])
    if len(made) > 1:
        out["extra_views"] = [{"crop": c, "flip_prob": f} for c, f in made[1:]]
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
