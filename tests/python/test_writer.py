"""stoker.DatasetWriter: samples written from Python reach the loader, the
CLI and the webdataset library exactly; bad values are refused naming the
sample and field; an unfinished writer leaves nothing behind."""
import gc
import io
import json
import os
import subprocess
import tarfile
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
import webdataset as wds


def jpeg_bytes(seed, size=(40, 30)):
    rng = np.random.default_rng(seed)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(out, format="JPEG")
    return out.getvalue()


def samples_in(path):
    return len(stoker.Loader(path, batch_size=1, fields={"label": stoker.Int("cls")}).dataset)


def detection_samples(n):
    rng = np.random.default_rng(7)
    for i in range(n):
        yield {"__key__": "img/%04d" % i, "__url__": "ignored", "jpg": jpeg_bytes(i), "cls": i % 3,
               "mask.png": rng.integers(0, 5, (30, 40), dtype=np.uint8),
               "boxes.npy": rng.random((i % 4 + 1, 4), dtype=np.float32),
               "txt": "caption %d é" % i, "score": i / 4, "meta": {"id": i, "crowd": i % 2 == 0},
               "depth": None}


def test_every_kind_of_value_reaches_the_loader_exactly(tmp_path):
    samples = list(detection_samples(12))
    with stoker.DatasetWriter(tmp_path / "out", shard_size="16KiB", class_names=["a", "b", "c"]) as writer:
        for s in samples:
            writer.write(s)
        assert writer.samples == 12
    summary = writer.close()  # closed by the with block; closing again returns the summary
    assert summary["samples"] == 12 and summary["shards"] >= 2 and summary["class_names"] == ["a", "b", "c"]

    loader = stoker.Loader(tmp_path / "out", batch_size=4, shuffle=False, fields={
        "jpg": stoker.Bytes("jpg"), "label": stoker.Int("cls"), "mask": stoker.Image(keys="mask.png", mode="L",
                                                                                     transform=None),
        "boxes": stoker.Array("boxes.npy", pad=None), "txt": stoker.Text("txt"), "score": stoker.Float("score"),
        "meta": stoker.Json("meta")}, with_indices=True)
    seen = 0
    for batch in loader:
        for j, i in enumerate(batch["__index__"].tolist()):
            s = samples[i]
            assert batch["jpg"][j] == s["jpg"]
            assert batch["label"][j].item() == s["cls"]
            assert torch.equal(batch["mask"][j][..., 0], torch.from_numpy(s["mask.png"]))
            assert torch.equal(batch["boxes"][j], torch.from_numpy(s["boxes.npy"]))
            assert batch["txt"][j] == s["txt"]
            assert batch["score"][j].item() == s["score"]
            assert batch["meta"][j] == s["meta"]
            seen += 1
    assert seen == 12
    assert stoker.Loader(tmp_path / "out", batch_size=4).dataset.classes == ["a", "b", "c"]


def test_the_webdataset_library_reads_what_it_writes(tmp_path):
    samples = list(detection_samples(5))
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        for s in samples:
            writer.write(s)
    read = list(wds.WebDataset(sorted(str(p) for p in (tmp_path / "out").glob("shard-*.tar")), shardshuffle=False,
                               empty_check=False))
    assert [r["__key__"] for r in read] == [s["__key__"] for s in samples]
    for r, s in zip(read, samples, strict=True):
        assert set(r) - {"__key__", "__url__", "__local_path__"} == {"jpg", "cls", "mask.png", "boxes.npy", "txt",
                                                                     "score", "meta"}
        assert r["jpg"] == s["jpg"] and int(r["cls"]) == s["cls"]
        assert np.array_equal(np.load(io.BytesIO(r["boxes.npy"])), s["boxes.npy"])
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(r["mask.png"]))), s["mask.png"])
        assert json.loads(r["meta"]) == s["meta"] and r["txt"].decode() == s["txt"]


def test_images_from_pil_arrays_and_hugging_face_dicts(tmp_path):
    pixels = np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    depth = np.random.default_rng(2).integers(0, 65536, (20, 30), dtype=np.uint16)
    photo = jpeg_bytes(3)
    (tmp_path / "on_disk.jpg").write_bytes(photo)
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        writer.write({"png": Image.fromarray(pixels)})  # lossless
        writer.write({"webp": pixels})  # lossless
        writer.write({"jpg": {"bytes": photo, "path": "ignored.jpg"}})
        writer.write({"jpg": {"bytes": None, "path": str(tmp_path / "on_disk.jpg")}})
        writer.write({"jpeg": torch.from_numpy(pixels)})  # JPEG at quality 95
        writer.write({"tif": pixels})  # lossless (LZW)
        writer.write({"tiff": depth})  # 16-bit gray, kept whole
    loader = stoker.Loader(tmp_path / "out", batch_size=7, shuffle=False, fields={
        "image": stoker.Image(transform=None), "raw": stoker.Bytes("jpg", optional=True),
        "depth": stoker.Image(keys="tiff", mode="I;16", transform=None, optional=True)})
    batch = next(iter(loader))
    assert torch.equal(batch["image"][0], torch.from_numpy(pixels))
    assert torch.equal(batch["image"][1], torch.from_numpy(pixels))
    assert batch["raw"][2] == photo and batch["raw"][3] == photo
    # Encoded as Pillow encodes at quality 95, decoded as Pillow decodes.
    reference = io.BytesIO()
    Image.fromarray(pixels).save(reference, format="JPEG", quality=95)
    assert torch.equal(batch["image"][4], torch.from_numpy(np.array(Image.open(reference).convert("RGB"))))
    assert torch.equal(batch["image"][5], torch.from_numpy(pixels))
    assert torch.equal(batch["depth"][6][..., 0], torch.from_numpy(depth.astype(np.int32)))
    # Default keys: the position, zero-padded, so that name order is write order.
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        assert tar.getnames()[:2] == ["000000000.png", "000000001.webp"]


@pytest.mark.parametrize("field,value,says", [
    ("boxes", np.zeros((2, 4), np.float32), "name ending in .npy (e.g. 'boxes.npy')"),
    ("boxes.npy", np.array([object()]), "Python objects"),
    ("boxes.npy", b"not npy", "not a .npy file"),
    ("image", Image.new("RGB", (4, 4)), "name ending in .png"),
    ("jpg", "a path?", "an image field takes bytes"),
    ("jpg", np.zeros((4, 4), np.float32), "must be uint8"),
    ("jpg", np.zeros((4, 4), np.uint16), "uint16 (H, W) for PNG and TIFF"),
    ("jpg", b"", "0 bytes, not an image (fix or remove it; keep_bad_images keeps such images as they are"),
    ("jpg", b"GIF89a" + bytes(10), "a GIF image: stoker decodes JPEG"),
    ("mask.png", b"<html>not found</html>", "not an image: neither JPEG, PNG"),
    ("jpg", {"bytes": jpeg_bytes(1)[:30], "path": None}, "not a decodable JPEG"),
    ("cls", "cat", "an integer field takes an int"),
    ("cls", 2.5, "an integer field takes an int"),
    ("meta.json", {"x": float("nan")}, "JSON cannot hold"),
    ("json", b"{not json", "not JSON"),
    ("txt", b"\xff\xfe", "not UTF-8"),
    ("txt", 3, "a text field takes str"),
    ("score", float("inf"), "must be finite"),
    ("thing", object(), "cannot store a object"),
    ("emb.npy", torch.zeros(3, dtype=torch.bfloat16), "BFloat16"),  # NumPy has no bfloat16: torch says so
])
def test_a_value_it_cannot_store_names_the_sample_and_field_and_changes_nothing(tmp_path, field, value, says):
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        with pytest.raises((ValueError, TypeError)) as e:
            writer.write({"__key__": "bad", field: value})
        assert "sample 'bad', field '%s'" % field in str(e.value) and says in str(e.value), str(e.value)
        writer.write({"__key__": "bad", "cls": 1})  # the key was not taken
    assert samples_in(tmp_path / "out") == 1


_JPEG = jpeg_bytes(0)


@pytest.mark.parametrize("sample,exc,says", [
    ({"__key__": "photo.v2", "jpg": _JPEG}, ValueError, "'.' in its last part 'photo.v2'"),
    ({"__key__": "../up", "jpg": _JPEG}, ValueError, "'..'"),
    ({"__key__": 7, "jpg": _JPEG}, TypeError, "__key__ must be a str"),
    ({"__key__": "k", "JPG": _JPEG}, ValueError, "upper-case"),
    ({"__key__": "k", "a/b": b"x"}, ValueError, "holds a '/'"),
    ({"__key__": "k"}, ValueError, "no fields"),
    ({"__key__": "k", 3: b"x"}, TypeError, "field names are str"),
])
def test_keys_and_names_that_would_not_read_back_are_refused(tmp_path, sample, exc, says):
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        with pytest.raises(exc, match=None) as e:
            writer.write(sample)
        assert says in str(e.value), str(e.value)
        writer.write({"__key__": "k", "cls": 0})
        with pytest.raises(ValueError, match="'k' given twice"):
            writer.write({"__key__": "k", "cls": 1})
    with pytest.raises(TypeError, match="a sample is a dict"):
        stoker.DatasetWriter(tmp_path / "other").write([b"x"])


def test_a_strided_view_is_refused_not_written_as_the_bytes_under_it(tmp_path):
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        with pytest.raises(ValueError, match="field 'bin': a buffer that is not contiguous"):
            writer.write({"__key__": "k", "bin": memoryview(b"abcdef")[::2]})
        writer.write({"__key__": "k", "bin": memoryview(b"abcdef")[1:4]})  # contiguous: fine
    loader = stoker.Loader(tmp_path / "out", batch_size=1, fields={"b": stoker.Bytes("bin")})
    assert next(iter(loader))["b"] == [b"bcd"]


def test_an_exception_in_the_with_block_or_a_dropped_writer_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError, match="source failed"):
        with stoker.DatasetWriter(tmp_path / "out", shard_size="8KiB") as writer:
            for i, s in enumerate(detection_samples(20)):
                writer.write(s)
                if i == 15:
                    raise RuntimeError("source failed")
    assert list((tmp_path / "out").iterdir()) == []
    with pytest.raises(ValueError, match="aborted"):
        writer.close()

    writer = stoker.DatasetWriter(tmp_path / "dropped", shard_size="8KiB")
    for s in detection_samples(20):
        writer.write(s)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del writer
        gc.collect()
    assert any("dropped without close(): the 20 samples written are removed" in str(w.message) for w in caught)
    assert list((tmp_path / "dropped").iterdir()) == []

    with pytest.raises(ValueError, match="no samples were written"):
        stoker.DatasetWriter(tmp_path / "empty").close()
    assert list((tmp_path / "empty").iterdir()) == []


def test_a_forked_child_cannot_write_and_its_copy_removes_nothing(tmp_path, stoker_bin):
    writer = stoker.DatasetWriter(tmp_path / "out", shard_size="8KiB")
    samples = list(detection_samples(10))
    for s in samples[:6]:
        writer.write(s)
    pid = os.fork()
    if pid == 0:  # a multiprocessing worker forked mid-write: it tries, then drops its copy
        code = 1
        try:
            writer.write({"__key__": "child", "cls": 1})
        except stoker.StokerError as e:
            code = 0 if "forked child" in str(e) else 2
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "dropped without close()" in the child
            del writer
            gc.collect()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    for s in samples[6:]:
        writer.write(s)
    assert writer.close()["samples"] == 10
    assert samples_in(tmp_path / "out") == 10
    assert subprocess.run([stoker_bin, "verify", str(tmp_path / "out")],
                          capture_output=True).returncode == 0


def test_a_folder_holding_a_dataset_is_replaced_only_when_asked(tmp_path):
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        writer.write({"cls": 1})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        stoker.DatasetWriter(tmp_path / "out")
    with stoker.DatasetWriter(tmp_path / "out", overwrite=True) as writer:
        writer.write({"cls": 2})
        writer.write({"cls": 3})
    assert samples_in(tmp_path / "out") == 2
    with pytest.raises(ValueError, match="closed"):
        writer.write({"cls": 4})


def test_the_same_samples_give_identical_files(tmp_path):
    for out in ("a", "b"):
        with stoker.DatasetWriter(tmp_path / out, shard_size="16KiB") as writer:
            for s in detection_samples(10):
                writer.write(s)
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir()) and "index.stoker" in names
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_pgm_and_ppm_fields_are_written_losslessly_and_an_alpha_channel_is_refused(tmp_path):
    rgb = np.random.default_rng(3).integers(0, 256, (9, 7, 3), dtype=np.uint8)
    gray = rgb[..., 0].copy()
    with stoker.DatasetWriter(tmp_path / "out") as writer:
        writer.write({"__key__": "a", "ppm": rgb, "pgm": gray})
        with pytest.raises(ValueError, match="field 'ppm': a PGM/PPM holds gray \\(L\\) or RGB pixels, not RGBA"):
            writer.write({"__key__": "b", "ppm": np.dstack([rgb, gray])})
    batch = next(iter(stoker.Loader(tmp_path / "out", batch_size=1, fields={
        "rgb": stoker.Image(keys="ppm", transform=None), "gray": stoker.Image(keys="pgm", mode="L", transform=None)})))
    assert np.array_equal(batch["rgb"][0].numpy(), rgb)
    assert np.array_equal(batch["gray"][0].numpy()[..., 0], gray)


def test_kept_bad_images_are_stored_as_given_counted_and_named(tmp_path, caplog):
    with stoker.DatasetWriter(tmp_path / "out", keep_bad_images=True) as writer:
        for i in (3, 1, 2):
            writer.write({"__key__": "bad%d" % i, "jpg": b"GIF89a" + bytes(10), "png": b""})
        writer.write({"__key__": "good", "jpg": jpeg_bytes(2)})
    summary = writer.close()
    assert summary["samples"] == 4 and summary["bad_images_kept"] == 6
    assert summary["bad_images_named"] == [
        "bad1, field 'jpg': a GIF image: stoker decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP (convert it before "
        "packing)", "bad1, field 'png': 0 bytes, not an image",
        "bad2, field 'jpg': a GIF image: stoker decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP (convert it before "
        "packing)", "bad2, field 'png': 0 bytes, not an image",
        "bad3, field 'jpg': a GIF image: stoker decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP (convert it before "
        "packing)", "bad3, field 'png': 0 bytes, not an image"]
    # The index's note records them, as pack's does: a loader that would stop at the first says so when made.
    with caplog.at_level("WARNING", logger="stoker"):
        stoker.Loader(tmp_path / "out", batch_size=2, log_epochs=False)
    assert "holds 6 images that the loader cannot decode" in caplog.text and "bad1, field 'jpg'" in caplog.text
    with pytest.raises(TypeError, match="keep_bad_images must be True or False"):
        stoker.DatasetWriter(tmp_path / "other", keep_bad_images="no")
