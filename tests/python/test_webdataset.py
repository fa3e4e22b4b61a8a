"""Compatibility with the real `webdataset` library, both ways:
webdataset reads stoker's shards unchanged, and stoker indexes shards written
by GNU tar with exactly the samples and fields that webdataset yields."""
import json
import subprocess

import pytest

import webdataset as wds  # noqa: E402
from fake_images import fake_image  # noqa: E402 (tests/python is on the path)


def webdataset_samples(urls):
    dataset = wds.WebDataset([str(u) for u in urls], shardshuffle=False, empty_check=False)
    return list(dataset)


def test_webdataset_reads_stoker_shards(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out, "--shard-size", "1MiB")
    shards = sorted(out.glob("shard-*.tar"))
    samples = webdataset_samples(shards)
    files = sorted(p for p in demo_images.rglob("*.JPEG"))
    classes = sorted(p.name for p in demo_images.iterdir())
    assert len(samples) == len(files)
    for sample, path in zip(samples, files, strict=True):
        rel = path.relative_to(demo_images)
        assert sample["__key__"] == str(rel.with_suffix(""))
        assert sample["jpeg"] == path.read_bytes()
        assert int(sample["cls"]) == classes.index(rel.parts[0])

    # And through webdataset's decoders, as a training loop would use them.
    decoded = wds.WebDataset([str(s) for s in shards], shardshuffle=False).decode("pil").to_tuple("jpeg", "cls")
    image, label = next(iter(decoded))
    assert image.size[0] >= 300 and image.size[1] >= 300 and label == 0


def build_tree(root):
    """Names that exercise the WebDataset rule and tar's long-name encodings."""
    files = {
        "sub/dir/a.jpg": fake_image("a.jpg", b"A-jpg"),
        "sub/dir/a.cls": b"7",
        "sub/dir/a.seg.png": fake_image("a.seg.png", b"A-seg"),  # multi-dot: field "seg.png"
        "sub/dir/B.JPG": fake_image("B.JPG", b"B-upper"),  # field lower-cased: "jpg"
        "sub/dir.v2/c.json": b"{}",             # dot in a folder name
        "sub/dir.v2/c.txt": b"text",
        "x" * 120 + "/long.jpg": fake_image("long.jpg", b"long dir"),  # > 100 chars: ustar prefix or long names
        "y/" + "z" * 150 + ".data.bin": b"long file",
        "y/" + "z" * 150 + ".cls": b"3",
        "__meta__": b"skipped by webdataset",
        "hid/.hidden.txt": b"key 'hid/'",       # base_plus_ext backtracking case
    }
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


@pytest.mark.parametrize("tar_format", ["pax", "gnu"])
def test_index_of_gnu_tar_shards_matches_webdataset(stoker, tmp_path, tar_format):
    root = tmp_path / "tree"
    build_tree(root)
    shard1 = tmp_path / "data-000000.tar"
    shard2 = tmp_path / "data-000001.tar"
    # Sorted, with directory members (which both readers skip).
    subprocess.run(["tar", "--format=" + tar_format, "--sort=name", "-cf", shard1, "-C", root, "sub", "__meta__", "hid"],
                   check=True)
    subprocess.run(["tar", "--format=" + tar_format, "--sort=name", "-cf", shard2, "-C", root, "x" * 120, "y"],
                   check=True)
    r = stoker("index", str(tmp_path / "data-{000000..000001}.tar"))
    assert "left out 7 members" in r.stdout  # directories and __meta__, each named on stderr
    assert "member '__meta__' left out as WebDataset leaves it out (a __*__ name)" in r.stderr, r.stderr

    listed = [json.loads(line) for line in stoker("ls", tmp_path / "index.stoker", "--json").stdout.splitlines()]
    expected = webdataset_samples([shard1, shard2])
    got = [(e["key"], sorted(e["fields"])) for e in listed]
    want = [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in expected]
    assert got == want
    # Bytes and labels agree too.
    for entry, sample in zip(listed, expected, strict=True):
        with open(tmp_path / entry["shard"], "rb") as f:
            for field, where in entry["fields"].items():
                f.seek(where["offset"])
                assert f.read(where["size"]) == sample[field]
        if "cls" in sample:
            assert entry["label"] == int(sample["cls"])
    stoker("verify", tmp_path / "index.stoker")
    # The folder itself names the same shards, in name order (tree/ is a folder, not a shard).
    r = stoker("index", tmp_path, "-o", tmp_path / "by-folder.stoker")
    assert "indexed %d samples in 2 shards" % len(listed) in r.stdout, r.stdout
    assert stoker("ls", tmp_path / "by-folder.stoker", "--json").stdout.splitlines() == \
        stoker("ls", tmp_path / "index.stoker", "--json").stdout.splitlines()


def test_index_rejects_truncated_tar(stoker, tmp_path):
    root = tmp_path / "tree"
    build_tree(root)
    shard = tmp_path / "cut.tar"
    subprocess.run(["tar", "--format=pax", "-cf", shard, "-C", root, "sub"], check=True)
    data = shard.read_bytes()
    shard.write_bytes(data[:3000])
    r = stoker("index", shard, check=False)
    assert r.returncode != 0
    assert "cut.tar:" in r.stderr and ("truncated" in r.stderr), r.stderr
    assert not (tmp_path / "index.stoker").exists()


def test_index_leaves_out_members_without_extension_as_webdataset_does(stoker, tmp_path):
    # A GNU tar with a README among the samples: the webdataset library reads
    # it (leaving the README out); so does stoker, naming what it left out.
    root = tmp_path / "tree"
    (root / "k").mkdir(parents=True)
    (root / "k" / "a.jpg").write_bytes(fake_image("a.jpg", b"x"))
    (root / "k" / "a.cls").write_bytes(b"4")
    (root / "k" / "README").write_bytes(b"y")
    (root / "k" / "b.jpg").write_bytes(fake_image("b.jpg", b"z"))
    shard = tmp_path / "s.tar"
    subprocess.run(["tar", "--sort=name", "-cf", shard, "-C", root, "k"], check=True)
    r = stoker("index", shard)
    assert "member 'k/README' left out as WebDataset leaves it out (no extension" in r.stderr, r.stderr
    listed = [json.loads(line) for line in stoker("ls", tmp_path / "index.stoker", "--json").stdout.splitlines()]
    want = [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in webdataset_samples([shard])]
    assert [(e["key"], sorted(e["fields"])) for e in listed] == want == [("k/a", ["cls", "jpg"]), ("k/b", ["jpg"])]
    summary = json.loads(stoker("inspect", tmp_path / "index.stoker", "--json").stdout)
    assert summary["skipped_members"] == 2  # the folder member k/ and k/README
    assert "skipped  2 tar members" in stoker("inspect", tmp_path / "index.stoker").stdout
    stoker("verify", tmp_path / "index.stoker")
