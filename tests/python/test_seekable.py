"""Seekable JPEGs (`pack --seekable-jpeg`): lossless on disk, the loader's
batches identical to a plain pack's, tables that disagree decoded whole."""
import io
import json
import os
import sys
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import stoker

T = stoker.transforms


@pytest.fixture(scope="module")
def packs(cli, demo_images, tmp_path_factory):
    root = tmp_path_factory.mktemp("seekable")
    src = root / "src"
    # The demo tree plus what cannot be made seekable: progressive, CMYK, not a JPEG at all.
    import shutil
    shutil.copytree(demo_images, src)
    first = sorted(src.rglob("*.JPEG"))[0]
    img = Image.open(first).convert("RGB")
    img.save(first.parent / "zz_progressive.JPEG", quality=90, progressive=True)
    img.convert("CMYK").save(first.parent / "zz_cmyk.JPEG", quality=90)
    cli("pack", src, root / "plain", "--shard-size", "1MiB")
    out = cli("pack", src, root / "seekable", "--shard-size", "1MiB", "--seekable-jpeg").stdout
    assert "re-written losslessly with restart intervals" in out, out
    return src, root / "plain", root / "seekable", out


def test_the_summary_and_inspect_count_what_was_rewritten_and_kept(cli, packs):
    src, plain, seekable, out = packs
    n = len(list(src.rglob("*.JPEG")))
    assert "seekable JPEGs: %d re-written" % (n - 2) in out and "2 kept as they were" in out, out
    info = json.loads(cli("inspect", seekable, "--json").stdout)
    assert info["seekable_payloads"] == n - 2
    note = info["pack"]["seekable_jpeg"]
    assert note["images_rewritten"] == n - 2 and note["kept_progressive"] == 1 and note["kept_cmyk"] == 1
    assert note["rewritten_bytes_after"] < note["rewritten_bytes_before"] * 1.02
    text = cli("inspect", seekable).stdout
    assert "seekable %d of %d JPEGs re-written" % (n - 2, n) in text and "1 progressive" in text, text
    assert json.loads(cli("inspect", plain, "--json").stdout)["seekable_payloads"] == 0
    cli("verify", seekable)  # checksums, tar members and offsets all agree


def test_a_seekable_pack_is_deterministic(cli, packs, tmp_path):
    src, _, seekable, _ = packs
    cli("pack", src, tmp_path / "again", "--shard-size", "1MiB", "--seekable-jpeg", "--threads", "1")
    names = sorted(p.name for p in seekable.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "again").iterdir())
    for name in names:
        assert (seekable / name).read_bytes() == (tmp_path / "again" / name).read_bytes(), name


def test_the_stored_jpegs_decode_to_the_originals_pixels_with_any_decoder(packs):
    src, _, seekable, _ = packs
    originals = {p.relative_to(src).with_suffix("").as_posix(): p for p in src.rglob("*.JPEG")}
    checked = 0
    for shard in sorted(seekable.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if not member.name.endswith(".jpeg"):
                    continue
                stored = tar.extractfile(member).read()
                original = originals[member.name[: -len(".jpeg")]]
                a = np.asarray(Image.open(io.BytesIO(stored)).convert("RGB"))
                b = np.asarray(Image.open(original).convert("RGB"))
                assert np.array_equal(a, b), member.name
                if "zz_" not in member.name:
                    assert b"\xff\xdd" in stored  # a restart interval
                checked += 1
    assert checked == len(originals)


def batches(path, transform, epochs=1, **kw):
    loader = stoker.Loader(path, batch_size=8, transform=transform, seed=11, log_epochs=False, **kw)
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out += [(x.clone(), y.clone()) for x, y in loader]
    return out, loader.stats()


@pytest.mark.parametrize("name", ["train", "train_no_dct", "rotation", "eval"])
def test_the_loaders_batches_are_those_of_the_plain_pack(packs, name):
    _, plain, seekable, _ = packs
    transform = {
        "train": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]),
        "train_no_dct": T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip()], dct_scaling=False),
        "rotation": T.Compose([T.RandomRotation(20), T.RandomResizedCrop(112), T.RandomHorizontalFlip()]),
        "eval": T.Compose([T.Resize(256), T.CenterCrop(224)]),
    }[name]
    a, _ = batches(plain, transform, epochs=2)
    b, stats = batches(seekable, transform, epochs=2)
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb)
    assert stats["seekable_fallbacks"] == 0
    if name == "eval":
        assert stats["seekable_decodes"] == 0  # the whole image is resized: nothing to skip
    else:
        assert stats["seekable_decodes"] > stats["samples"] // 2, stats


def test_a_table_that_disagrees_with_its_jpeg_is_decoded_whole_and_counted(cli, packs, tmp_path):
    _, _, seekable, _ = packs
    import shutil
    edited = tmp_path / "edited"
    shutil.copytree(seekable, edited)
    index = edited / "index.stoker"
    data = bytearray(index.read_bytes())
    # The offsets end the file: move every one of the last 2000 by one byte (the loader does not check the
    # index's data checksum; verify does).
    for at in range(len(data) - 8000, len(data), 4):
        value = int.from_bytes(data[at:at + 4], "little")
        data[at:at + 4] = (value + 1).to_bytes(4, "little")
    index.write_bytes(bytes(data))
    transform = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip()])
    a, _ = batches(seekable, transform)
    b, stats = batches(edited, transform)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert stats["seekable_fallbacks"] > 0, stats
    # The edit reached region records too: reads of the crop's rows that disagree were read whole.
    assert stats["seekable_part_rereads"] > 0, stats
    # verify names each such sample (and the index's data checksum).
    result = cli("verify", edited, "--decode", check=False)
    assert result.returncode != 0
    assert "disagrees with the JPEG's markers" in result.stderr and "shard-0000" in result.stderr, result.stderr


def test_a_crop_reads_only_its_rows_and_gets_the_same_pixels(packs):
    _, plain, seekable, _ = packs
    transform = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip()])
    a, whole = batches(seekable, transform, epochs=2, read_crop_rows=False)
    b, part = batches(seekable, transform, epochs=2)
    c, unchecked = batches(seekable, transform, epochs=2, verify_samples=False)
    p, _ = batches(plain, transform, epochs=2)
    for (xa, ya), (xb, yb), (xc, yc), (xp, yp) in zip(a, b, c, p, strict=True):
        assert torch.equal(xa, xb) and torch.equal(xa, xc) and torch.equal(xa, xp)
        assert torch.equal(ya, yb) and torch.equal(ya, yc)
    assert whole["seekable_part_reads"] == 0
    for stats in (part, unchecked):
        assert stats["seekable_part_reads"] > stats["samples"] // 2 and stats["seekable_part_rereads"] == 0, stats
        assert stats["seekable_fallbacks"] == 0
    # Only the head and the crop's MCU rows are read (bytes_read counts the image's bytes).
    per_sample = lambda stats: stats["bytes_read"] / stats["samples_read"]
    assert per_sample(part) < 0.85 * per_sample(whole), (part, whole)


def test_inspect_says_whether_crops_read_only_their_rows(cli, packs, tmp_path):
    import ctypes
    import shutil
    _, _, seekable, _ = packs
    assert "a random crop reads only the MCU rows it covers" in cli("inspect", seekable).stdout
    assert json.loads(cli("inspect", seekable, "--json").stdout)["region_records"] is True
    # The index as version 6 wrote it (tables, no region records: its pool's extra bytes are not read): crops read
    # whole JPEGs, to the same pixels, and inspect says how to get reads in part.
    old = tmp_path / "old"
    shutil.copytree(seekable, old)
    data = bytearray((old / "index.stoker").read_bytes())
    assert int.from_bytes(data[8:12], "little") == 7
    data[8:12] = (6).to_bytes(4, "little")
    records = int.from_bytes(data[80:88], "little")
    data[104:112] = bytes(8)  # the meta checksum covers [0, records) with itself zero
    xxh = ctypes.CDLL("libxxhash.so.0")
    xxh.XXH3_64bits.restype = ctypes.c_uint64
    xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    data[104:112] = xxh.XXH3_64bits(bytes(data[:records]), records).to_bytes(8, "little")
    (old / "index.stoker").write_bytes(bytes(data))
    text = cli("inspect", old).stdout
    assert "a random crop reads the whole JPEG" in text and "stoker index" in text, text
    assert json.loads(cli("inspect", old, "--json").stdout)["region_records"] is False
    transform = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip()])
    a, _ = batches(seekable, transform)
    b, stats = batches(old, transform)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert stats["seekable_part_reads"] == 0 and stats["seekable_decodes"] > stats["samples"] // 2, stats


def test_a_damaged_head_read_in_part_is_read_whole_and_named(packs, tmp_path):
    # A byte of a JPEG's APP0 segment changed in the shard: no decoder notices, the region record's check of
    # the head does; read whole, the sample's checksum names it.
    import shutil
    _, _, seekable, _ = packs
    edited = tmp_path / "edited"
    shutil.copytree(seekable, edited)
    shard = sorted(edited.glob("shard-*.tar"))[0]
    with tarfile.open(shard) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith(".jpeg") and "zz_" not in m.name)
    data = bytearray(shard.read_bytes())
    assert data[member.offset_data + 6:member.offset_data + 10] == b"JFIF"
    data[member.offset_data + 16] ^= 1  # the density: harmless to decoding
    shard.write_bytes(bytes(data))
    key = member.name[: -len(".jpeg")]
    transform = T.Compose([T.RandomResizedCrop(64)])
    loader = stoker.Loader(edited, batch_size=8, transform=transform, seed=11, log_epochs=False, shuffle=False)
    with pytest.raises(stoker.CorruptionError, match="sample '%s'.*checksum mismatch" % key):
        for _ in loader:
            pass
    assert loader.stats()["seekable_part_rereads"] >= 1


def test_stoker_index_finds_the_restart_tables_of_shards_written_elsewhere(cli, packs, tmp_path):
    # The seekable pack's shards without its index, as shards another tool wrote from JPEGs with restart
    # intervals (`jpegtran -restart`): `stoker index` finds every table pack recorded, and the loader seeks.
    import shutil
    _, _, seekable, _ = packs
    for shard in seekable.glob("shard-*.tar"):
        shutil.copy(shard, tmp_path / shard.name)
    last = len(list(seekable.glob("shard-*.tar"))) - 1
    out = cli("index", str(tmp_path / ("shard-{000000..%06d}.tar" % last))).stdout
    packed = json.loads(cli("inspect", seekable, "--json").stdout)["seekable_payloads"]
    assert "%d JPEGs have restart intervals" % packed in out, out
    assert json.loads(cli("inspect", tmp_path, "--json").stdout)["seekable_payloads"] == packed
    assert "seekable %d JPEGs carry restart tables" % packed in cli("inspect", tmp_path).stdout
    cli("verify", tmp_path, "--decode")  # every table agrees with its JPEG's markers
    transform = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip()])
    a, _ = batches(seekable, transform)
    b, stats = batches(tmp_path, transform)
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert stats["seekable_decodes"] > stats["samples"] // 2 and stats["seekable_fallbacks"] == 0, stats
    # A plain pack's JPEGs have no restart interval: nothing is found.
    _, plain, _, _ = packs
    assert "restart intervals" not in cli("index", str(plain / "shard-000000.tar"),
                                          "--output", str(tmp_path / "plain.stoker")).stdout


def test_a_remote_seekable_pack_decodes_from_its_intervals(packs, tmp_path):
    sys.path.insert(0, os.path.dirname(__file__))
    import remote_servers
    _, _, seekable, _ = packs
    server = remote_servers.Nginx(seekable)
    try:
        transform = T.Compose([T.RandomResizedCrop(128), T.RandomHorizontalFlip()])
        local, _ = batches(seekable, transform)
        remote, stats = batches(server.url, transform, cache_dir=tmp_path / "cache")
    finally:
        server.close()
    for (xa, ya), (xb, yb) in zip(local, remote, strict=True):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert stats["seekable_decodes"] > stats["samples"] // 2 and stats["seekable_fallbacks"] == 0, stats


def test_the_python_pack_takes_seekable_jpeg(demo_images, tmp_path):
    summary = stoker.pack(demo_images, tmp_path / "p", seekable_jpeg=True)
    assert summary["seekable_jpegs"] == summary["samples"] and summary["seekable_kept"] == 0
    assert summary["seekable_bytes_after"] > 0
    assert json.loads(summary["note"])["seekable_jpeg"]["images_rewritten"] == summary["samples"]
    with pytest.raises(TypeError):
        stoker.pack(demo_images, tmp_path / "q", seekable_jpeg="yes")
