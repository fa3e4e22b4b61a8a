"""`stoker pack --max-side N --quality Q` against Pillow: the re-encoded images
are what ImageOps.exif_transpose + Image.resize(BILINEAR) give (up to JPEG's
own loss), small images and other files are byte-identical, and the index
says what was done."""
import io
import json
import tarfile

import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image, ImageOps  # noqa: E402

import stoker as stoker_package  # noqa: E402 (the `stoker` fixture is the command line)


def _photo(width, height, seed):
    """A smooth, photo-like RGB image (gradients and a disc), so JPEG's loss stays small."""
    img = Image.new("RGB", (width, height))
    px = img.load()
    for y in range(height):
        for x in range(width):
            inside = (x - width / 3) ** 2 + (y - height / 2) ** 2 < (min(width, height) / 4) ** 2
            px[x, y] = (int(255 * x / width), int(255 * y / height), 200 if inside else (seed * 40) % 256)
    return img


def _save(img, path, orientation=None, quality=95):
    path.parent.mkdir(parents=True, exist_ok=True)
    kwargs = {"quality": quality}
    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        kwargs["exif"] = exif.tobytes()
    img.save(path, "JPEG", **kwargs)
    return path.read_bytes()


def _members(out):
    found = {}
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                found[m.name] = tar.extractfile(m).read()
    return found


def _mean_abs_diff(a, b):
    assert a.size == b.size, (a.size, b.size)
    pa, pb = a.convert("RGB").tobytes(), b.convert("RGB").tobytes()
    return sum(abs(x - y) for x, y in zip(pa, pb)) / len(pa)


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
def test_max_side_matches_pillow_exif_transpose_and_resize(stoker, tmp_path, orientation):
    src = tmp_path / "src"
    original = _save(_photo(320, 200, 1), src / "a" / "big.jpg", orientation=orientation)
    small = _save(_photo(90, 60, 2), src / "a" / "small.jpg", orientation=6)
    (src / "b").mkdir()
    _photo(40, 30, 3).save(src / "b" / "note.png")  # not a JPEG: stored as it is
    r = stoker("pack", "--max-side", "128", "--quality", "95", src, tmp_path / "out")
    assert "re-encoded 1 JPEGs over 128 px at quality 95" in r.stdout, r.stdout
    members = _members(tmp_path / "out")
    assert members["a/small.jpg"] == small, "a small image stays byte-identical, EXIF and all"
    assert members["b/note.png"] == (src / "b" / "note.png").read_bytes()

    ours = Image.open(io.BytesIO(members["a/big.jpg"]))
    assert ours.getexif().get(0x0112) is None, "the orientation is in the pixels, not in EXIF"
    reference = ImageOps.exif_transpose(Image.open(io.BytesIO(original)))
    w, h = reference.size
    scale = 128 / max(w, h)
    size = (128, round(h * scale)) if w >= h else (round(w * scale), 128)
    assert ours.size == size
    expected = reference.resize(size, Image.BILINEAR)
    diff = _mean_abs_diff(ours, expected)
    assert diff < 3.0, "mean level difference %.2f from Pillow's exif_transpose + resize" % diff

    inspect = stoker("inspect", tmp_path / "out")
    assert "images over 128 px re-encoded at quality 95 (1 of 2 JPEGs" in inspect.stdout, inspect.stdout
    note = json.loads(stoker("inspect", "--json", tmp_path / "out").stdout)["pack"]
    assert note["max_side"] == 128 and note["images_reencoded"] == 1 and note["images_kept"] == 1
    stoker("verify", tmp_path / "out")


def test_python_pack_takes_max_side_and_bad_images_are_named(stoker, tmp_path):
    src = tmp_path / "src"
    _save(_photo(300, 300, 3), src / "a" / "one.jpg")
    result = stoker_package.pack(src, tmp_path / "out", max_side=100, quality=80)
    assert result["images_reencoded"] == 1 and json.loads(result["note"])["quality"] == 80
    with pytest.raises(ValueError, match="quality needs max_side"):
        stoker_package.pack(src, tmp_path / "out2", quality=80)
    (src / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not really a JPEG")
    r = stoker("pack", "--max-side", "100", src, tmp_path / "out3", check=False)
    assert r.returncode != 0
    assert "a/broken" in r.stderr and "broken.jpg" in r.stderr, r.stderr
    assert not (tmp_path / "out3" / "index.stoker").exists()
    r = stoker("pack", "--quality", "80", src, tmp_path / "out4", check=False)
    assert r.returncode != 0 and "max-side" in r.stderr, r.stderr


def test_python_pack_takes_threads_and_writes_the_same_dataset_with_any_number(tmp_path):
    """threads= (the CLI's --threads): the shards and index do not depend on
    how many threads read and re-encode; bad values are refused by name."""
    src = tmp_path / "src"
    for i in range(12):
        _save(_photo(90 + 7 * i, 80, i), src / ("c%d" % (i % 3)) / ("%02d.jpg" % i))
    written = {}
    for n in (1, 5):
        out = tmp_path / ("out%d" % n)
        summary = stoker_package.pack(src, out, max_side=64, threads=n, shard_size=4096)
        assert summary["samples"] == 12 and summary["images_reencoded"] == 12
        written[n] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    assert len(written[1]) > 2 and written[1] == written[5]
    for bad, error, text in ((0, ValueError, "threads must be at least 1"),
                             (2000, ValueError, "threads must be at most 1024"),
                             (True, TypeError, "threads must be an integer")):
        with pytest.raises(error, match=text):
            stoker_package.pack(src, tmp_path / "bad", threads=bad)
    assert not (tmp_path / "bad").exists()
