"""stoker.pack and `stoker pack` over Parquet files shaped as Hugging Face
datasets writes them: image structs, a ClassLabel with its names, text,
numbers and nested objects, several files."""
import io
import json
import os
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

pa = pytest.importorskip("pyarrow")
import pyarrow.parquet as pq  # noqa: E402

ENV = dict(os.environ, STOKER_PYTHON=sys.executable)  # the Python that has pyarrow
CLASSES = ["cat", "dog", "eel"]


def encoded(pixels, fmt):
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def hf_rows(n, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        pixels = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
        mask = rng.integers(0, 4, (12, 16), dtype=np.uint8)
        rows.append({
            "image": {"bytes": encoded(pixels, "PNG" if i % 3 == 0 else "JPEG"), "path": "img%d.jpg" % i},
            "label": i % 3,
            "mask": {"bytes": encoded(mask, "PNG"), "path": None} if i % 4 else None,
            "caption": "a photo %d" % i,
            "score": i / 8,
            "objects": {"bbox": [[1.0, 2.0, 3.0, 4.0 + i]], "category": [i % 3]},
            "_pixels": pixels, "_mask": mask})
    return rows


def write_hf_parquet(path, rows, extra_column=None):
    features = {"image": {"_type": "Image"}, "label": {"names": CLASSES, "_type": "ClassLabel"},
                "mask": {"_type": "Image"}, "caption": {"dtype": "string", "_type": "Value"},
                "score": {"dtype": "float64", "_type": "Value"},
                "objects": {"bbox": [[{"dtype": "float32", "_type": "Value"}]],
                            "category": [{"dtype": "int64", "_type": "Value"}]}}
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    columns = {"image": pa.array([r["image"] for r in rows], image),
               "label": pa.array([r["label"] for r in rows], pa.int64()),
               "mask": pa.array([r["mask"] for r in rows], image),
               "caption": pa.array([r["caption"] for r in rows], pa.string()),
               "score": pa.array([r["score"] for r in rows], pa.float64()),
               "objects": pa.array([r["objects"] for r in rows])}
    if extra_column:
        columns[extra_column] = pa.array([1] * len(rows), pa.int64())
    table = pa.table(columns).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})})
    pq.write_table(table, path, row_group_size=5)


@pytest.fixture
def hf_folder(tmp_path):
    rows = hf_rows(14)
    folder = tmp_path / "hf"
    folder.mkdir()
    write_hf_parquet(folder / "train-00000-of-00002.parquet", rows[:9])
    write_hf_parquet(folder / "train-00001-of-00002.parquet", rows[9:])
    return folder, rows


FIELDS = {"image": stoker.Image(transform=None), "label": stoker.Int("cls"),
          "mask": stoker.Image(keys="mask.png", mode="L", transform=None, optional=True),
          "caption": stoker.Text("caption"), "score": stoker.Float("score"), "objects": stoker.Json("objects")}


def check_samples(out, rows):
    loader = stoker.Loader(out, batch_size=7, shuffle=False, fields=FIELDS)
    assert loader.dataset.classes == CLASSES
    seen = 0
    for batch in loader:
        for j, caption in enumerate(batch["caption"]):
            row = rows[int(caption.split()[-1])]  # "a photo <row>"
            assert caption == row["caption"]
            if row["image"]["bytes"][:4] == b"\x89PNG":
                assert torch.equal(batch["image"][j], torch.from_numpy(row["_pixels"]))
            else:  # a JPEG, kept byte for byte: decoded as Pillow decodes it
                expected = np.array(Image.open(io.BytesIO(row["image"]["bytes"])).convert("RGB"))
                assert torch.equal(batch["image"][j], torch.from_numpy(expected))
            assert batch["label"][j].item() == row["label"]
            if row["mask"] is None:
                assert batch["mask"][j] is None
            else:
                assert torch.equal(batch["mask"][j][..., 0], torch.from_numpy(row["_mask"]))
            assert batch["score"][j].item() == row["score"]
            assert batch["objects"][j] == row["objects"]
            seen += 1
    assert seen == len(rows)


def test_a_hugging_face_parquet_folder_packs_with_every_column(hf_folder, tmp_path):
    folder, rows = hf_folder
    with pytest.raises(ValueError, match="threads are for files and manifests, not Parquet"):
        stoker.pack(folder, tmp_path / "out", threads=4)
    summary = stoker.pack(folder, tmp_path / "out", shard_size="16KiB")
    assert summary["samples"] == 14 and summary["class_names"] == CLASSES and summary["shards"] >= 2
    check_samples(tmp_path / "out", rows)
    # Keys are positions over all files, in order; images named by their format.
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        names = tar.getnames()
    assert names[:7] == ["000000000.caption", "000000000.cls", "000000000.objects", "000000000.png",
                         "000000000.score", "000000001.caption", "000000001.cls"]
    assert "000000001.jpg" in names and "000000001.mask.png" in names


def test_the_command_line_packs_parquet_and_shuffles_keeping_class_names(hf_folder, tmp_path, stoker_bin):
    folder, rows = hf_folder
    run = subprocess.run([stoker_bin, "pack", str(folder / "train-*.parquet"), str(tmp_path / "out"),
                          "--shuffle", "--shuffle-seed", "3", "--shard-size", "16KiB"],
                         capture_output=True, text=True, env=ENV)
    assert run.returncode == 0, run.stderr
    assert "packed 14 samples from 2 Parquet files" in run.stdout
    assert "labels: 3 classes" in run.stdout
    check_samples(tmp_path / "out", rows)
    loader = stoker.Loader(tmp_path / "out", batch_size=14, shuffle=False, fields={"c": stoker.Text("caption")})
    order = next(iter(loader))["c"]
    assert sorted(order) == sorted(r["caption"] for r in rows) and order != [r["caption"] for r in rows]
    assert not [p for p in tmp_path.iterdir() if "staging" in p.name]  # the temporary copy is gone
    inspect = subprocess.run([stoker_bin, "inspect", str(tmp_path / "out")], capture_output=True, text=True, env=ENV)
    for line in ("objects          json", "caption          text", "score            float",
                 "mask.png         image"):
        assert line in inspect.stdout, inspect.stdout

    again = subprocess.run([stoker_bin, "pack", str(folder), str(tmp_path / "out")], capture_output=True, text=True, env=ENV)
    assert again.returncode != 0 and "already holds a dataset" in again.stderr and "--force" in again.stderr
    threads = subprocess.run([stoker_bin, "pack", str(folder), str(tmp_path / "o2"), "--threads", "4"],
                             capture_output=True, text=True, env=ENV)
    assert threads.returncode != 0 and "not Parquet" in threads.stderr


def test_a_save_to_disk_folder_of_arrow_files_packs_with_its_dataset_info(tmp_path, stoker_bin):
    """datasets' save_to_disk: data-*.arrow (Arrow IPC streams whose schema
    has no features) beside dataset_info.json, which has them."""
    rows = hf_rows(11)
    split = tmp_path / "saved" / "train"
    split.mkdir(parents=True)
    image = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for k, part in enumerate((rows[:6], rows[6:])):
        table = pa.table({"image": pa.array([r["image"] for r in part], image),
                          "label": pa.array([r["label"] for r in part], pa.int64()),
                          "caption": pa.array([r["caption"] for r in part], pa.string())})
        with pa.OSFile(str(split / ("data-%05d-of-00002.arrow" % k)), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as stream:
                stream.write_table(table, max_chunksize=4)
    (split / "dataset_info.json").write_text(json.dumps({"features": {
        "image": {"_type": "Image"}, "label": {"names": CLASSES, "_type": "ClassLabel"},
        "caption": {"dtype": "string", "_type": "Value"}}}))
    (split / "state.json").write_text("{}")
    (tmp_path / "saved" / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(ValueError, match="it holds the splits train: pack one, e.g. .*saved/train"):
        stoker.pack(tmp_path / "saved", tmp_path / "out")
    run = subprocess.run([stoker_bin, "pack", str(tmp_path / "saved"), str(tmp_path / "out")], capture_output=True,
                         text=True, env=ENV)
    assert run.returncode == 1 and "pack one, e.g." in run.stderr, run.stderr
    run = subprocess.run([stoker_bin, "pack", str(split), str(tmp_path / "out")], capture_output=True, text=True,
                         env=ENV)
    assert run.returncode == 0, run.stderr
    assert "packed 11 samples from 2 Arrow files" in run.stdout
    loader = stoker.Loader(tmp_path / "out", batch_size=11, shuffle=False,
                           fields={"label": stoker.Int("cls"), "caption": stoker.Text("caption"),
                                   "image": stoker.Bytes("jpg;png")})
    assert loader.dataset.classes == CLASSES
    batch = next(iter(loader))
    assert batch["caption"] == [r["caption"] for r in rows]
    assert batch["label"].tolist() == [r["label"] for r in rows]
    assert batch["image"] == [r["image"]["bytes"] for r in rows]


def test_the_image_feature_is_the_main_image_even_after_an_audio_column(tmp_path):
    rows = hf_rows(3)
    audio = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"audio": pa.array([{"bytes": b"RIFF....WAVEfmt ", "path": "a%d.wav" % i} for i in range(3)],
                                        audio),
                      "image": pa.array([r["image"] for r in rows], audio),
                      "label": pa.array([0, 1, 2], pa.int64())}).replace_schema_metadata({"huggingface": json.dumps(
                          {"info": {"features": {"audio": {"_type": "Audio"}, "image": {"_type": "Image"},
                                                 "label": {"names": CLASSES, "_type": "ClassLabel"}}}})})
    pq.write_table(table, tmp_path / "av.parquet")
    stoker.pack(tmp_path / "av.parquet", tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        names = tar.getnames()
    assert names[:3] == ["000000000.audio.wav", "000000000.cls", "000000000.png"], names


def test_a_webdataset_derived_parquet_keeps_its_keys(tmp_path):
    rows = hf_rows(3)
    table = pa.table({"__key__": ["a/x", "a/y", "b/z"], "__url__": ["u"] * 3,
                      "jpg": [r["image"]["bytes"] for r in rows], "cls": [0, 1, 1]})
    pq.write_table(table, tmp_path / "wds.parquet")
    stoker.pack(tmp_path / "wds.parquet", tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        assert sorted({n.split(".")[0] for n in tar.getnames()}) == ["a/x", "a/y", "b/z"]


def test_bad_parquet_input_is_named(hf_folder, tmp_path, stoker_bin):
    folder, rows = hf_folder
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(ValueError, match="broken.parquet: cannot be read as Parquet"):
        stoker.pack(tmp_path / "broken.parquet", tmp_path / "out")
    assert not (tmp_path / "out" / "index.stoker").exists()
    run = subprocess.run([stoker_bin, "pack", str(tmp_path / "broken.parquet"), str(tmp_path / "out")],
                         capture_output=True, text=True, env=ENV)
    assert run.returncode == 1 and "broken.parquet: cannot be read as Parquet" in run.stderr, run.stderr

    other = tmp_path / "mixed"
    other.mkdir()
    write_hf_parquet(other / "a.parquet", rows[:3])
    write_hf_parquet(other / "b.parquet", rows[3:6], extra_column="extra")
    with pytest.raises(ValueError, match="b.parquet: its columns .* differ from .*a.parquet"):
        stoker.pack(other, tmp_path / "out2")
    assert not (tmp_path / "out2").exists() or list((tmp_path / "out2").iterdir()) == []
    clash = tmp_path / "clash.parquet"
    pq.write_table(pa.table({"image": pa.array([rows[0]["image"]], pa.struct([("bytes", pa.binary()),
                                                                              ("path", pa.string())])),
                             "png": pa.array(["a column named like the image's field"])}), clash)
    with pytest.raises(ValueError, match="columns 'image' and 'png' would both be the field 'png'"):
        stoker.pack(clash, tmp_path / "out4")
    with pytest.raises(FileNotFoundError, match="no file matches"):
        stoker.pack(str(tmp_path / "nothing-*.parquet"), tmp_path / "out3")
    # An image cut inside its header (a JPEG by its first bytes) is named; kept on request, counted.
    cut = [dict(r) for r in rows[:3]]
    cut[1]["image"] = {"bytes": rows[1]["image"]["bytes"][:30], "path": "cut.jpg"}
    write_hf_parquet(tmp_path / "cut.parquet", cut)
    for seekable in (False, True):  # written straight, and through the staging copy
        with pytest.raises(ValueError, match=r"cut.parquet: row 1 .*not a decodable JPEG"):
            stoker.pack(tmp_path / "cut.parquet", tmp_path / ("out6-%d" % seekable), seekable_jpeg=seekable)
        summary = stoker.pack(tmp_path / "cut.parquet", tmp_path / ("out6-%d" % seekable), seekable_jpeg=seekable,
                              keep_bad_images=True)
        assert summary["samples"] == 3 and summary["bad_images_kept"] == 1, summary
        assert summary["bad_images_named"][0].startswith("000000001, field 'jpg': not a decodable JPEG"), summary
    # Rows are read a few batches ahead on a thread of their own; a row that fails to write, with more
    # batches read behind it, names its row and leaves no thread behind.
    keys = ["k%04d" % i for i in range(1000)]
    keys[300] = "../escape"
    pq.write_table(pa.table({"__key__": keys, "cls": list(range(1000))}), tmp_path / "keys.parquet",
                   row_group_size=100)
    with pytest.raises(ValueError, match=r"keys.parquet: row 300 .*'\.\./escape'") as caught:
        stoker.pack(tmp_path / "keys.parquet", tmp_path / "out5")
    # (checked while the error's traceback, and the frames it holds, are still alive)
    assert caught.value is not None and not [t for t in threading.enumerate() if t.name == "stoker-parquet-reader"]


def test_every_image_format_stoker_decodes_is_named_by_its_bytes(tmp_path):
    # BMP, PGM and PPM images (Pillow saves them) in an Image column become "bmp", "pgm" and "ppm" fields the
    # loader decodes, whatever the path says; they were ".bin" fields once, a sample without an image.
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (12, 16, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (12, 16), dtype=np.uint8)
    images = [(encoded(rgb, "BMP"), "bmp", rgb), (encoded(gray, "PPM"), "pgm", np.stack([gray] * 3, -1)),
              (encoded(rgb, "PPM"), "ppm", rgb), (encoded(rgb, "PNG"), "png", rgb)]
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": b, "path": None if i % 2 else "photo%d.jpg" % i}
                                         for i, (b, _, _) in enumerate(images)], struct),
                      "caption": ["%d" % i for i in range(len(images))]}).replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": {"image": {"_type": "Image"},
                                                          "caption": {"dtype": "string", "_type": "Value"}}}})})
    pq.write_table(table, tmp_path / "formats.parquet")
    stoker.pack(tmp_path / "formats.parquet", tmp_path / "out")
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        names = sorted(n for n in tar.getnames() if not n.endswith(".caption"))
    assert names == ["%09d.%s" % (i, ext) for i, (_, ext, _) in enumerate(images)], names
    loader = stoker.Loader(tmp_path / "out", batch_size=4, shuffle=False, log_epochs=False,
                           fields={"image": stoker.Image(keys="jpg;png;bmp;pgm;ppm", transform=None),
                                   "caption": stoker.Text("caption")})
    batch = next(iter(loader))
    for j, caption in enumerate(batch["caption"]):
        assert torch.equal(batch["image"][j], torch.from_numpy(images[int(caption)][2])), caption


@pytest.mark.parametrize("column", ["image", "jpg"])
def test_bytes_that_are_no_image_in_an_image_column_are_a_bad_image(tmp_path, column):
    # An Image feature's (or a column named "jpg"'s) value that is no image, such as an error page saved by a
    # scraper, with no path to name it: once stored silently as "<column>.bin", leaving a sample the loader
    # found without its image. Now a bad image: named, or kept where the loader looks, counted and skipped.
    rows = hf_rows(3)
    values = [r["image"]["bytes"] for r in rows]
    values[1] = b"<html><body>403 Forbidden</body></html>"
    if column == "image":
        # A second Image column too: its bad value is kept where its other images are ("mask.png").
        masks = [{"bytes": encoded(r["_mask"], "PNG"), "path": None} for r in rows]
        masks[1] = {"bytes": b"", "path": None}
        struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        table = pa.table({"image": pa.array([{"bytes": v, "path": None} for v in values], struct),
                          "mask": pa.array(masks, struct),
                          "label": pa.array([0, 1, 2], pa.int64())}).replace_schema_metadata(
            {"huggingface": json.dumps({"info": {"features": {"image": {"_type": "Image"}, "mask": {"_type": "Image"},
                                                              "label": {"names": CLASSES, "_type": "ClassLabel"}}}})})
    else:
        table = pa.table({"jpg": pa.array(values, pa.binary()), "cls": [0, 1, 2]})
    pq.write_table(table, tmp_path / "scraped.parquet")
    # Kept under the column's last image's format: row 0 is a PNG.
    with pytest.raises(ValueError, match=r"scraped.parquet: row 1 .*sample '000000001', field 'png': not an image"):
        stoker.pack(tmp_path / "scraped.parquet", tmp_path / "out")
    assert not (tmp_path / "out" / "index.stoker").exists()
    summary = stoker.pack(tmp_path / "scraped.parquet", tmp_path / "out", keep_bad_images=True)
    assert summary["bad_images_kept"] == (2 if column == "image" else 1), summary
    assert summary["bad_images_named"][-1].startswith("000000001, field 'png': not an image"), summary
    with tarfile.open(tmp_path / "out" / "shard-000000.tar") as tar:
        assert "000000001.png" in tar.getnames(), tar.getnames()
        if column == "image":
            assert "000000001.mask.png" in tar.getnames(), tar.getnames()
            assert summary["bad_images_named"][0] == "000000001, field 'mask.png': 0 bytes, not an image", summary
    loader = stoker.Loader(tmp_path / "out", batch_size=3, shuffle=False, on_corrupt="skip", log_epochs=False,
                           fields={"image": stoker.Image(transform=None), "label": stoker.Int("cls")})
    assert sum(len(b["label"]) for b in loader) == 3  # the bad one's place filled by a good sample
    assert loader.stats()["corrupt_skipped"] == 1
