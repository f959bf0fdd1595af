"""The pipeline spec's own names for torchvision's recipes, no torchvision needed (issue 39
item 4, docs/python.md "Keep your torchvision code"): `Loader(ops=[...], erasing={...},
batch_mix={...})` and the same per view, checked at `Loader(...)` for their kinds and field
names. test_transforms.py has the torchvision side."""

import os

import pytest

import stoker
from stoker._spec import build_spec

# An existing folder: the Loader checks that its dataset path exists when it is made, before
# anything is served; these tests look only at the spec.
HERE = os.path.dirname(os.path.abspath(__file__))


def refused(match, **kw):
    """The message of the SpecError `Loader(...)` raises for these arguments (no daemon is
    asked: autostart is off and nothing attaches)."""
    with pytest.raises(stoker.SpecError, match=match) as e:
        stoker.Loader(HERE, autostart=False, **kw)
    return str(e.value)


REFERENCE_OPS = [{"kind": "trivial_augment_wide"}]
REFERENCE_ERASING = {"p": 0.1}
REFERENCE_MIX = {"kind": "choice", "mixes": [{"kind": "mix_up", "alpha": 0.2, "num_classes": 3},
                                             {"kind": "cut_mix", "alpha": 1.0, "num_classes": 3}]}


def test_the_specs_own_names_need_no_torchvision():
    ld = stoker.Loader(HERE, crop=176, autostart=False, ops=REFERENCE_OPS,
                       erasing=REFERENCE_ERASING, batch_mix=REFERENCE_MIX)
    assert ld.spec["ops"] == REFERENCE_OPS
    assert ld.spec["erasing"] == REFERENCE_ERASING
    assert ld.spec["batch_mix"] == REFERENCE_MIX
    assert ld.spec["crop"]["size"] == [176, 176] and ld.spec["flip_prob"] == 0.5
    plain = stoker.Loader(HERE, autostart=False).spec
    assert not {"ops", "erasing", "batch_mix"} & set(plain), "left out when unused"
    dino = [{"crop": 224, "scale": (0.4, 1), "ops": [{"kind": "random_grayscale", "p": 0.2}]},
            {"crop": 96, "scale": (0.05, 0.4)}]
    s = stoker.Loader(HERE, autostart=False, views=dino,
                      ops=[{"kind": "random_solarize", "threshold": 128}]).spec
    assert s["ops"] == [{"kind": "random_grayscale", "p": 0.2}], "the view's own"
    assert s["extra_views"][0]["ops"] == [{"kind": "random_solarize", "threshold": 128}], \
        "the Loader's fills the rest"


def test_bad_spec_dicts_are_refused_naming_them():
    msg = refused("Loader\\(ops=...\\)\\[1\\].*'elastic'.*kind must be one of",
                  ops=[{"kind": "random_invert"}, {"kind": "elastic"}])
    assert "color_jitter" in msg
    refused("ops=...\\)\\[0\\]\\.ops\\[0\\]: operation 'gaussian_blur': needs kernel_size",
            ops=[{"kind": "random_apply", "ops": [{"kind": "gaussian_blur"}]}])
    refused("'color_jitter'.*no field brightnes ", ops=[{"kind": "color_jitter",
                                                         "brightnes": [0.5, 1]}])
    refused("erasing.*no field valu", erasing={"valu": 0})
    refused("batch_mix.*kind", batch_mix={"kind": "mixup", "num_classes": 3})
    refused("mix_up.*needs num_classes", batch_mix={"kind": "mix_up"})
    refused("batch_mix.*is not JSON", batch_mix="{mix_up")
    assert stoker.Loader(HERE, autostart=False, batch_mix='{"kind": "cut_mix", '
                         '"num_classes": 4}').spec["batch_mix"] == {"kind": "cut_mix",
                                                                    "num_classes": 4}
    refused("MixUp / CutMix need a float output.*u8", dtype="u8",
            batch_mix={"kind": "mix_up", "num_classes": 3})
    with pytest.raises(ValueError, match="with spec="):
        stoker.Loader(HERE, autostart=False, spec=build_spec(4, 32),
                      ops=[{"kind": "random_invert"}])
