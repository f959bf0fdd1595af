"""Against a real stokerd (CPU backend): a WebDataset shard set written with Python's own
`tarfile` (pax headers) holding per key a JPEG (Pillow), a caption (`txt`), a JSON record and a
class, served with `Loader(fields=...)`: every caption and record is the sample's own, byte for
byte (or decoded as asked), beside its image, across a replaced bad sample and a resume; a
caption over `field_max_bytes` is a FieldError for that sample only."""

import io
import json
import random
import tarfile

import numpy as np
import pytest

import stoker

SHARDS, PER_SHARD = 2, 6
BAD, LONG, LONG_BYTES, MAX = 3, 8, 600, 256


def caption(i):
    return f"sample {i}: a caf\u00e9 \u2014 {'word ' * (i % 7)}\n".encode()


def record(i):
    return json.dumps({"i": i, "tags": ["a", "\u00e9"], "w": i * 0.5}).encode()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    Image = pytest.importorskip("PIL.Image", reason="Pillow makes the test JPEGs")
    root = tmp_path_factory.mktemp("fields") / "shards"
    root.mkdir()
    rng = random.Random(7)
    captions = []
    for s in range(SHARDS):
        with tarfile.open(root / f"train-{s:03}.tar", "w", format=tarfile.PAX_FORMAT) as tar:
            for k in range(PER_SHARD):
                i = s * PER_SHARD + k
                out = io.BytesIO()
                side = rng.randint(40, 80)
                Image.frombytes("RGB", (side, side), rng.randbytes(side * side * 3)).save(
                    out, format="JPEG", quality=90)
                jpeg = b"not a JPEG at all" if i == BAD else out.getvalue()
                text = caption(i) if i != LONG else caption(i).ljust(LONG_BYTES, b"z")
                captions.append(text)
                for ext, data in (("jpg", jpeg), ("txt", text), ("json", record(i)),
                                  ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"part{s}/key-{i:04}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root, captions


def loader(root, daemon, job, fields, epochs=2):
    return stoker.Loader(root, batch_size=4, crop=16, dtype="u8", epochs=epochs, seed=7,
                         job=job, socket=daemon, autostart=False, fields=fields,
                         field_max_bytes=MAX)


def served(ld):
    """(epoch, step, index, status, label, caption, record) of every sample left in `ld`."""
    out = []
    for b in ld.batches():
        fields = b.fields
        indices, status = np.from_dlpack(b.indices), np.from_dlpack(b.status)
        labels = np.from_dlpack(b.labels)
        for i in range(b.n):
            out.append((b.epoch, b.step, int(indices[i]), int(status[i]), int(labels[i]),
                        fields["txt"][i], fields["json"][i]))
    return out


def same(a, b):
    """Served samples compared with FieldErrors by their message."""
    def key(row):
        return tuple(str(v) if isinstance(v, stoker.FieldError) else v for v in row)
    return [key(r) for r in a] == [key(r) for r in b]


def test_captions_and_records_are_each_samples_own(shards, daemon):
    root, captions = shards
    with loader(root, daemon, "py-fields", {"txt": "str", "json": "json"}) as ld:
        got = served(ld)
    assert len(got) == 2 * SHARDS * PER_SHARD
    replaced = 0
    for epoch, step, index, status, label, text, rec in got:
        assert index != BAD, "the bad sample was served"
        assert status in (0, 1)
        replaced += status == 1
        assert label == index % 3
        assert rec == json.loads(record(index)), (index, rec)
        if index == LONG:
            assert isinstance(text, stoker.FieldError), text
            assert (text.sample, text.field, text.reason) == (LONG, "txt", "too_large")
            assert f'field "txt" of sample {LONG}' in str(text), str(text)
            assert f"{LONG_BYTES} bytes, over the spec's field_max_bytes of {MAX}" in str(text)
        else:
            assert text == captions[index].decode(), (index, text)
    assert replaced == 2, "the bad sample is replaced once an epoch"


def test_bytes_are_exact_and_a_resume_serves_the_same_fields(shards, daemon):
    root, captions = shards
    with loader(root, daemon, "py-fields-bytes", ["txt", "json"]) as ld:
        whole = served(ld)
    for *_, index, _status, _label, text, rec in whole:
        assert rec == record(index)
        if index != LONG:
            assert text == captions[index]
    with loader(root, daemon, "py-fields-resume", ["txt", "json"]) as ld:
        it = iter(ld)
        images, labels, fields = next(it)
        assert set(fields) == {"txt", "json"} and len(fields["txt"]) == 4
        state = ld.state_dict()
    with loader(root, daemon, "py-fields-resume", ["txt", "json"]) as ld:
        ld.load_state_dict(state)
        rest = served(ld)
    assert same(rest, whole[4:]), "a resumed loader serves the uninterrupted run's fields"


def test_fields_are_checked_at_the_loader(tmp_path):
    with pytest.raises(stoker.SpecError, match="fields"):
        stoker.Loader(tmp_path, fields="txt")
    with pytest.raises(stoker.SpecError, match=r"fields\['txt'\]"):
        stoker.Loader(tmp_path, fields={"txt": "text"})
    with pytest.raises(stoker.SpecError, match="field_max_bytes"):
        stoker.Loader(tmp_path, fields=["txt"], field_max_bytes=0)
