"""Typed fields and dict batches: a WebDataset of mixed samples (JPEG image,
PNG mask, JSON boxes, .npy depth of varying shape, caption, id), indexed in
place, against what Pillow, NumPy and json decode from the same bytes; plus
optional fields, specs refused at creation, and bad fields named."""
import io
import json
import re
import tarfile
import types

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

T = stoker.transforms
rng = np.random.default_rng(11)


def member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def encoded(image, fmt, **kw):
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


def npy(array):
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def index(cli, folder):
    # These shards hold fields damaged on purpose, for the loader to name.
    cli("index", "--keep-bad-images", *sorted(folder.glob("*.tar")))


def write_shards(folder, n=20, per_shard=8, caption_every=1, corrupt=None):
    """Samples 000000..: jpg, seg.png, json, npy, txt (every caption_every-th), id."""
    folder.mkdir(parents=True, exist_ok=True)
    truth = []
    for s in range(0, n, per_shard):
        with tarfile.open(folder / ("shard-%06d.tar" % (s // per_shard)), "w") as tar:
            for i in range(s, min(n, s + per_shard)):
                key = "%06d" % i
                h, w = 40 + i % 7, 56 + (i * 3) % 11
                y, x = np.mgrid[0:h, 0:w]
                rgb = np.stack([x * 4 + i, y * 5, (x + y) * 2], axis=2).astype(np.uint8)
                jpg = encoded(Image.fromarray(rgb), "JPEG", quality=90)
                mask = encoded(Image.fromarray((rng.integers(0, 5, (h, w)) * 50).astype(np.uint8)), "PNG")
                boxes = json.dumps({"boxes": [[i, 2, 30, 20]], "labels": [i % 3], "name": "ünïcode %d" % i})
                depth = rng.standard_normal((2 + i % 3, 4)).astype(np.float32)
                sample = {"jpg": jpg, "seg.png": mask, "json": boxes.encode(), "npy": npy(depth),
                          "id": b"%d\n" % (1000 + i)}
                if i % caption_every == 0:
                    sample["txt"] = ("a caption for %d, é" % i).encode()
                if corrupt and i == corrupt[0]:
                    sample[corrupt[1]] = corrupt[2]
                for ext, data in sample.items():
                    member(tar, key + "." + ext, data)
                truth.append(sample)
    return truth


@pytest.fixture(scope="module")
def mixed(cli, tmp_path_factory):
    folder = tmp_path_factory.mktemp("fields") / "shards"
    truth = write_shards(folder, caption_every=3)
    index(cli, folder)
    return folder, truth


FIELDS = {
    "image": stoker.Image(transform=T.Compose([T.Resize(48), T.CenterCrop(48)])),
    "raw": stoker.Image(keys="jpg", transform=None),
    "mask": stoker.Image(keys="seg.png", mode="L"),
    "boxes": stoker.Json(),
    "depth": stoker.Array(pad=-1.0),
    "caption": stoker.Text(optional=True),
    "id": stoker.Int("id"),
    "blob": stoker.Bytes("json"),
}


def test_dict_batches_hold_every_field_as_pillow_numpy_and_json_decode_it(mixed):
    folder, truth = mixed
    loader = stoker.Loader(folder, batch_size=6, shuffle=False, fields=FIELDS, dtype="uint8", log_epochs=False,
                           with_indices=True)
    seen = 0
    for batch in loader:
        n = len(batch["id"])
        assert batch["image"].shape == (n, 48, 48, 3) and batch["image"].dtype == torch.uint8
        assert batch["id"].dtype == torch.int64
        for j in range(n):
            i = int(batch["__index__"][j])
            want = truth[i]
            assert int(batch["id"][j]) == 1000 + i
            ref, _ = T.apply(want["jpg"], T.Compose([T.Resize(48), T.CenterCrop(48)]), dtype="uint8")
            assert torch.equal(batch["image"][j], ref)
            assert np.array_equal(batch["raw"][j].numpy(), np.asarray(Image.open(io.BytesIO(want["jpg"])).convert("RGB")))
            mask = np.asarray(Image.open(io.BytesIO(want["seg.png"])).convert("L"))[:, :, None]
            assert np.array_equal(batch["mask"][j].numpy(), mask)
            assert batch["boxes"][j] == json.loads(want["json"])
            assert batch["blob"][j] == want["json"]
            depth = np.load(io.BytesIO(want["npy"]))
            rows = depth.shape[0]
            assert batch["depth_shape"][j].tolist() == list(depth.shape)
            assert np.array_equal(batch["depth"][j, :rows].numpy(), depth)
            assert (batch["depth"][j, rows:] == -1).all()
            if "txt" in want:
                assert batch["caption"][j] == want["txt"].decode()
            else:
                assert batch["caption"][j] is None
            seen += 1
    assert seen == len(truth)


def test_arrays_of_one_shape_stack_and_pad_none_gives_a_list(cli, tmp_path):
    folder = tmp_path / "shards"
    folder.mkdir()
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for i in range(6):
            member(tar, "%03d.npy" % i, npy(np.full((2, 3), i, dtype=">i4")))
            member(tar, "%03d.ragged.npy" % i, npy(np.arange(i + 1, dtype=np.uint16)))
            member(tar, "%03d.cls" % i, b"%d" % i)
    index(cli, folder)
    fields = {"a": stoker.Array(), "r": stoker.Array("ragged.npy"), "label": stoker.Int()}
    batch = next(iter(stoker.Loader(folder, batch_size=6, shuffle=False, fields=fields, log_epochs=False)))
    assert batch["a"].shape == (6, 2, 3) and batch["a"].dtype == torch.int32
    assert batch["a"][:, 0, 0].tolist() == list(range(6))
    assert isinstance(batch["r"], list) and [t.tolist() for t in batch["r"]] == [list(range(i + 1)) for i in range(6)]
    assert batch["r"][0].dtype == torch.int32  # uint16, widened
    assert batch["label"].tolist() == list(range(6))


def test_specs_that_cannot_work_are_refused_at_creation(mixed):
    folder, _ = mixed
    with pytest.raises(ValueError, match=r"field 'm' \(image\) names keys no sample .* has: mask.png .*its fields: "):
        stoker.Loader(folder, fields={"m": stoker.Image(keys="mask.png")}, log_epochs=False)
    stoker.Loader(folder, fields={"m": stoker.Image(keys="mask.png", optional=True)}, log_epochs=False)
    with pytest.raises(ValueError, match="only one Image may have a transform"):
        stoker.Loader(folder, fields={"a": stoker.Image(transform=T.Compose([T.Resize(8), T.CenterCrop(8)])),
                                      "b": stoker.Image(transform=T.Compose([T.Resize(8), T.CenterCrop(8)]))})
    with pytest.raises(ValueError, match="give the transform to its stoker.Image"):
        stoker.Loader(folder, fields={"a": stoker.Int("id")}, transform=T.Compose([T.Resize(8), T.CenterCrop(8)]))
    with pytest.raises(TypeError, match="fields\\['x'\\] must be a stoker.Image"):
        stoker.Loader(folder, fields={"x": "jpg"})
    with pytest.raises(ValueError, match="mode"):
        stoker.Image(mode="CMYK")


@pytest.mark.parametrize("field,spec,data,message", [
    ("json", stoker.Json(), b'{"boxes": [1, 2', "field 'f', key 'json'.*not valid JSON"),
    ("txt", stoker.Text(), b"caf\xe9", "field 'f', key 'txt'.*invalid UTF-8 at byte 3"),
    ("npy", stoker.Array(), npy(np.zeros(4, np.float32))[:-3], "field 'f', key 'npy'.*needs 16 bytes"),
    ("seg.png", stoker.Image(keys="seg.png"), b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, "field 'f', key 'seg.png'.*PNG"),
    ("id", stoker.Int("id"), b"12x", "field 'f', key 'id'.*'12x' is not an integer"),
])
def test_a_bad_field_is_named_with_its_sample_and_skippable(cli, tmp_path, field, spec, data, message):
    folder = tmp_path / "shards"
    write_shards(folder, n=10, per_shard=10, corrupt=(4, field, data))
    index(cli, folder)
    loader = stoker.Loader(folder, batch_size=10, shuffle=False, fields={"f": spec}, log_epochs=False)
    with pytest.raises(stoker.CorruptionError, match="sample '000004' " + "\\(" + message):
        next(iter(loader))
    loader = stoker.Loader(folder, batch_size=10, shuffle=False, fields={"f": spec, "id": stoker.Int("id")},
                           on_corrupt="skip", log_epochs=False)
    batch = next(iter(loader))
    assert 1004 not in batch["id"].tolist() and len(batch["id"]) == 10
    assert loader.stats()["corrupt_skipped"] == 1


def test_a_missing_required_field_is_named(cli, tmp_path):
    folder = tmp_path / "shards"
    write_shards(folder, n=6, per_shard=6, caption_every=2)
    index(cli, folder)
    # The index counts each field's samples: the loader fails when it is made, not mid-epoch.
    with pytest.raises(ValueError, match=r"field 'c' \(text\): 3 of 6 samples .* have none of its keys txt "
                                         r"\(the first: sample '000001' in shard-000000.tar\)"):
        stoker.Loader(folder, batch_size=6, shuffle=False, fields={"c": stoker.Text()}, log_epochs=False)
    # Skipping corrupt samples skips them as they come (a good one takes each place), each counted.
    loader = stoker.Loader(folder, batch_size=3, shuffle=False, fields={"c": stoker.Text()}, on_corrupt="skip",
                           log_epochs=False)
    captions = [c for b in loader for c in b["c"]]
    assert len(captions) == 6 and all(c is not None for c in captions)
    assert loader.stats()["corrupt_skipped"] == 3


def test_state_dict_resumes_dict_batches_exactly(mixed):
    folder, _ = mixed
    fields = {"id": stoker.Int("id"), "boxes": stoker.Json()}
    full = [b["id"].tolist() for b in stoker.Loader(folder, batch_size=4, seed=3, fields=fields, log_epochs=False)]
    loader = stoker.Loader(folder, batch_size=4, seed=3, fields=fields, log_epochs=False)
    it = iter(loader)
    first = [next(it)["id"].tolist() for _ in range(2)]
    state = loader.state_dict()
    resumed = stoker.Loader(folder, batch_size=4, seed=3, fields=fields, log_epochs=False)
    resumed.load_state_dict(state)
    rest = [b["id"].tolist() for b in resumed]
    assert first + rest == full
    assert sorted(sum(full, [])) == list(range(1000, 1020))


def test_map_and_collate_see_each_decoded_sample(mixed):
    folder, truth = mixed
    seen = []

    def add_area(sample):
        seen.append(sample["id"])
        box = sample["boxes"]["boxes"][0]
        sample["area"] = (box[2] - box[0]) * (box[3] - box[1])
        assert sample["mask"].dim() == 3 and sample["image"].shape == (3, 32, 32)
        return sample

    def collate(samples):
        return {"ids": [s["id"] for s in samples], "areas": [s["area"] for s in samples],
                "captions": [s["caption"] for s in samples]}

    fields = {"image": stoker.Image(transform=T.Compose([T.Resize(32), T.CenterCrop(32)])),
              "mask": stoker.Image(keys="seg.png", mode="L"), "boxes": stoker.Json(), "id": stoker.Int("id"),
              "caption": stoker.Text(optional=True)}
    loader = stoker.Loader(folder, batch_size=8, shuffle=False, fields=fields, map=add_area, collate=collate,
                           log_epochs=False)
    batches = list(loader)
    assert [i for b in batches for i in b["ids"]] == list(range(1000, 1020)) == seen
    for b in batches:
        for i, area, caption in zip(b["ids"], b["areas"], b["captions"]):
            x0, y0, x1, y1 = json.loads(truth[i - 1000]["json"])["boxes"][0]
            assert area == (x1 - x0) * (y1 - y0)
            assert caption == (truth[i - 1000]["txt"].decode() if "txt" in truth[i - 1000] else None)
    # map= alone: torch's default_collate stacks what it can.
    fields = {"id": stoker.Int("id"), "emb": stoker.Array()}
    batch = next(iter(stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields,
                                    map=lambda s: {"id": s["id"] * 2, "rows": s["emb"].shape[0]}, log_epochs=False)))
    assert batch["id"].tolist() == [2000, 2002, 2004, 2006]
    with pytest.raises(TypeError, match="map= takes a callable"):
        stoker.Loader(folder, fields=fields, map=3)
    with pytest.raises(ValueError, match="map= and collate= work on typed fields"):
        stoker.Loader(folder, map=lambda s: s)


@pytest.fixture(scope="module")
def wav_extension(tmp_path_factory):
    """The worked example, built as its header comment says."""
    import os
    import subprocess
    source = os.path.join(os.environ.get("STOKER_SOURCE_DIR", "."), "examples", "field_extension", "wav_pcm16.c")
    out = tmp_path_factory.mktemp("ext") / "libwav_pcm16.so"
    subprocess.run(["cc", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I",
                    os.path.join(os.environ.get("STOKER_SOURCE_DIR", "."), "include"), source, "-o", str(out)],
                   check=True)
    return out


def wav(samples):
    import wave
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(samples.shape[1])
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def test_a_decoder_of_ones_own_runs_on_the_loader_threads(cli, tmp_path, wav_extension):
    assert "wav_pcm16" in stoker.load_field_extension(wav_extension)
    assert "wav_pcm16" in stoker.load_field_extension(wav_extension)  # again: nothing happens
    folder = tmp_path / "shards"
    folder.mkdir()
    clips = [rng.integers(-32768, 32767, (800 + 100 * (i % 2), 2)) for i in range(6)]
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for i, clip in enumerate(clips):
            member(tar, "%03d.wav" % i, wav(clip))
            member(tar, "%03d.cls" % i, b"%d" % i)
        member(tar, "006.wav", b"RIFF\x04\x00\x00\x00WAVE")
        member(tar, "006.cls", b"6")
    index(cli, folder)
    fields = {"audio": stoker.Custom("wav", decoder="wav_pcm16"), "label": stoker.Int()}
    loader = stoker.Loader(folder, batch_size=6, shuffle=False, fields=fields, log_epochs=False)
    it = iter(loader)
    batch = next(it)
    assert batch["label"].tolist() == list(range(6))
    for clip, audio in zip(clips, batch["audio"]):
        assert audio.dtype == torch.float32 and audio.shape == (2, len(clip))
        assert torch.equal(audio, torch.from_numpy((clip.T / 32768.0).astype(np.float32)))
    with pytest.raises(stoker.CorruptionError, match="sample '006' .*decoder 'wav_pcm16': no fmt or data chunk"):
        next(it)
    with pytest.raises(FileNotFoundError, match="no field decoder 'mp3' is loaded \\(loaded: .*wav_pcm16"):
        stoker.Loader(folder, fields={"a": stoker.Custom("wav", decoder="mp3")}, log_epochs=False)
    with pytest.raises(FileNotFoundError, match="does not load"):
        stoker.load_field_extension(tmp_path / "missing.so")


def test_a_manifest_packs_image_mask_and_typed_columns(cli, tmp_path):
    """pack: a JSON Lines manifest naming an image and a mask per sample, with
    JSON, number and text columns; the index records each field's kind and
    count (inspect), the loader reads them back, and verify --decode names a
    mask that does not decode."""
    src = tmp_path / "src"
    src.mkdir()
    rows, masks = [], {}
    for i in range(10):
        rgb = rng.integers(0, 255, (20 + i, 30, 3), dtype=np.uint8)
        mask = (rng.integers(0, 4, (20 + i, 30)) * 60).astype(np.uint8)
        Image.fromarray(rgb).save(src / ("%d.jpg" % i), quality=92)
        row = {"path": "%d.jpg" % i, "label": i % 3, "boxes": [[i, 1, 5, 6]], "area": 0.5 * i, "caption": "pic %d" % i}
        if i != 4:  # sample 4 has no mask
            Image.fromarray(mask).save(src / ("%d_mask.png" % i))
            row["mask"] = "%d_mask.png" % i
            masks[i] = mask
        rows.append(row)
    (src / "list.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cli("pack", src / "list.jsonl", out, "--file-column", "mask")
    stoker.pack(src / "list.jsonl", tmp_path / "again", file_columns=["mask"])
    assert (tmp_path / "again" / "index.stoker").read_bytes() == (out / "index.stoker").read_bytes()
    with pytest.raises(TypeError, match="file_columns must be a list"):
        stoker.pack(src / "list.jsonl", tmp_path / "bad", file_columns="mask")

    summary = json.loads(cli("inspect", out, "--json").stdout)
    kinds = {f["name"]: (f["kind"], f["kind_recorded"], f["samples"]) for f in summary["fields"]}
    assert kinds == {"area": ("float", True, 10), "boxes": ("json", True, 10), "caption": ("text", True, 10),
                     "cls": ("int", True, 10), "jpg": ("image", True, 10), "mask.png": ("image", True, 9)}
    assert re.search(r"mask\.png +image +9 samples .*\(1 sample lacks it\)", cli("inspect", out).stdout)

    fields = {"image": stoker.Image(transform=None), "mask": stoker.Image(keys="mask.png", mode="L", transform=None),
              "boxes": stoker.Json("boxes"), "area": stoker.Float("area"), "caption": stoker.Text("caption")}
    with pytest.raises(ValueError, match=r"field 'mask' \(image\): 1 of 10 samples .* \(the first: sample '4' in "):
        stoker.Loader(out, batch_size=5, shuffle=False, fields=fields, log_epochs=False)
    fields["mask"] = stoker.Image(keys="mask.png", mode="L", transform=None, optional=True)
    with pytest.raises(ValueError, match=r"field 'boxes' \(array\) reads key 'boxes', which dataset .* records as json"):
        stoker.Loader(out, batch_size=5, fields=dict(fields, boxes=stoker.Array("boxes")), log_epochs=False)
    seen = 0
    for batch in stoker.Loader(out, batch_size=5, shuffle=False, fields=fields, log_epochs=False):
        for caption, mask, boxes, area in zip(batch["caption"], batch["mask"], batch["boxes"], batch["area"].tolist()):
            i = int(caption.split()[1])
            assert boxes == [[i, 1, 5, 6]] and area == 0.5 * i
            if i == 4:
                assert mask is None
            else:
                assert np.array_equal(mask.numpy()[:, :, 0], masks[i])
            seen += 1
    assert seen == 10

    assert cli("verify", out, "--decode").stdout.rstrip().endswith("OK")
    # A mask whose bytes are damaged in the shard: verify's checksums say so, and --decode says why it would not load.
    listing = [json.loads(line) for line in cli("ls", out, "--json").stdout.splitlines()]
    victim = next(s for s in listing if s["key"] == "7")
    with open(out / victim["shard"], "r+b") as f:
        f.seek(victim["fields"]["mask.png"]["offset"] + 20)
        f.write(b"\xff\xff\xff\xff")
    r = cli("verify", out, "--decode", "--json", check=False)
    assert r.returncode == 1
    problems = json.loads(r.stdout)["problems"]
    assert any(p["key"] == "7" and "field 'mask.png' (image) does not decode" in p["message"] for p in problems)
    assert json.loads(r.stdout)["decode"]["fields_decoded"] == 10 * 5 + 9 - 1


def test_dict_batches_split_exactly_once_across_world_sizes(mixed):
    """Elastic training with typed fields: two ranks take the first global batches, then three ranks
    restored from rank 0's state_dict (and one loader resharded in place to a world of one) take the
    rest; every sample arrives once, with its own fields."""
    folder, _ = mixed
    fields = {"id": stoker.Int("id"), "boxes": stoker.Json()}

    def loader(rank, world):
        return stoker.Loader(folder, global_batch_size=4, rank=rank, world_size=world, seed=5, fields=fields,
                             with_indices=True, log_epochs=False, min_world_size=1)

    def take(batch):
        for i, boxes in zip(batch["id"].tolist(), batch["boxes"]):
            assert boxes["boxes"][0][0] == i - 1000  # each sample's own fields
        assert len(batch["__index__"]) == len(batch["id"])
        return batch["id"].tolist()

    two = [loader(r, 2) for r in range(2)]
    its = [iter(l) for l in two]
    first = [i for _ in range(2) for it in its for i in take(next(it))]
    assert len(first) == 8
    state = two[0].state_dict()
    rest = []
    for r in range(3):
        resumed = loader(r, 3)
        resumed.load_state_dict(state)
        rest += [i for batch in resumed for i in take(batch)]
    assert sorted(first + rest) == list(range(1000, 1020))

    alone = two[1]
    alone.reshard(0, 1)
    alone.load_state_dict(state)
    assert sorted(i for batch in alone for i in take(batch)) == sorted(rest)


def test_device_cuda_with_fields_moves_tensors_and_keeps_lists(mixed, caplog):
    """Without a usable GPU here, device="cuda" says why and yields the CPU batches; the mover's contract
    (pinned source, its own stream that torch's current stream waits on, results recorded on the
    current stream, lists left on the host) is checked against a recording stand-in for torch.cuda; on
    a GPU, scripts/gpu-check's "fields" part checks it for real."""
    import logging
    folder, _ = mixed
    fields = {"id": stoker.Int("id"), "mask": stoker.Image(keys="seg.png", mode="L")}
    with caplog.at_level(logging.WARNING, logger="stoker"):
        loader = stoker.Loader(folder, batch_size=4, shuffle=False, fields=fields, device="cuda", log_epochs=False)
    if loader.device == "cpu":
        assert any("CUDA" in r.getMessage() or "GPU" in r.getMessage() for r in caplog.records), caplog.text
        batch = next(iter(loader))
        assert batch["id"].device.type == "cpu" and isinstance(batch["mask"], list)
    with pytest.raises(ValueError, match="gpu_preprocess=True and decode=\"gpu\" are for the"):
        stoker.Loader(folder, batch_size=4, fields=fields, device="cuda", gpu_preprocess=True)

    calls = []

    class Moved:
        def __init__(self, source):
            self.source = source

        def record_stream(self, stream):
            calls.append(("record", self.source, stream))

    class Tensor:
        def __init__(self, name):
            self.name = name

        def pin_memory(self):
            calls.append(("pin", self.name))
            return self

        def to(self, device, non_blocking):
            calls.append(("to", self.name, device, non_blocking, current_stream[0]))
            return Moved(self.name)

    current_stream = ["main"]

    class Cuda:
        class Stream:
            def __init__(self, device):
                self.device = device

            def wait_stream(self, other):
                raise AssertionError("the side stream waits on nothing: its sources are host memory")

        class _Main:
            def wait_stream(self, other):
                calls.append(("wait", "main", "side" if isinstance(other, Cuda.Stream) else other))

        @staticmethod
        def current_stream(device):
            return Cuda._Main()

        @staticmethod
        def stream(s):
            import contextlib

            @contextlib.contextmanager
            def on():
                current_stream[0] = "side"
                yield
                current_stream[0] = "main"
            return on()

    fake = types.SimpleNamespace(cuda=Cuda, device=lambda d: d, is_tensor=lambda v: isinstance(v, Tensor))
    mover = stoker.fields.DeviceMover(fake, "cuda:0")
    masks = [Tensor("m0"), Tensor("m1")]
    out = mover({"id": Tensor("id"), "mask": masks, "caption": ["a", "b"]})
    assert out["mask"] is masks and out["caption"] == ["a", "b"]  # lists stay on the host
    assert isinstance(out["id"], Moved)
    assert [c[0] for c in calls] == ["pin", "to", "wait", "record"]
    assert calls[1] == ("to", "id", "cuda:0", True, "side")  # non-blocking, on the side stream
    assert calls[2][2] == "side" and calls[3][1] == "id"
    calls.clear()
    images, labels = mover((Tensor("x"), Tensor("y")))
    assert isinstance(images, Moved) and isinstance(labels, Moved) and len(calls) == 2 + 2 + 1 + 2
    calls.clear()
    assert mover({"caption": ["only text"]}) == {"caption": ["only text"]} and calls == []


def test_arrays_of_one_shape_arrive_stacked_and_map_sees_each_row(tmp_path):
    flags = [rng.random((3, 5)) > 0.5 for _ in range(6)]
    counts = [rng.integers(0, 65536, (4,), dtype=np.uint16) for _ in range(6)]
    halves = [rng.standard_normal((2, 2)).astype(np.float16) for _ in range(6)]
    with stoker.DatasetWriter(tmp_path / "arrays") as writer:
        for i in range(6):
            sample = {"__key__": "%02d" % i, "flags.npy": flags[i], "counts.npy": counts[i], "half.npy": halves[i]}
            if i % 2:
                sample["sometimes.npy"] = np.arange(i)
            writer.write(sample)
    fields = {"flags": stoker.Array("flags.npy"), "counts": stoker.Array("counts.npy"),
              "half": stoker.Array("half.npy"), "sometimes": stoker.Array("sometimes.npy", optional=True)}
    batch = next(iter(stoker.Loader(tmp_path / "arrays", batch_size=6, shuffle=False, fields=fields)))
    assert batch["flags"].dtype == torch.bool and torch.equal(batch["flags"], torch.from_numpy(np.stack(flags)))
    assert batch["counts"].dtype == torch.int32  # torch 1.13 has no uint16
    assert torch.equal(batch["counts"], torch.from_numpy(np.stack(counts).astype(np.int32)))
    assert torch.equal(batch["half"], torch.from_numpy(np.stack(halves)))
    assert [None if t is None else t.tolist() for t in batch["sometimes"]] == [
        None if i % 2 == 0 else list(range(i)) for i in range(6)]
    # map= sees each sample's row of a stacked column.
    rows = []
    loader = stoker.Loader(tmp_path / "arrays", batch_size=6, shuffle=False, fields=fields,
                           map=lambda s: rows.append(s) or {"n": s["counts"].sum()})
    next(iter(loader))
    for i, sample in enumerate(rows):
        assert sample["flags"].dtype == torch.bool and torch.equal(sample["flags"], torch.from_numpy(flags[i]))
        assert torch.equal(sample["counts"], torch.from_numpy(counts[i].astype(np.int32)))
        assert sample["sometimes"] is None if i % 2 == 0 else sample["sometimes"].tolist() == list(range(i))
