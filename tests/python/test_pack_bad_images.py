"""Pack checks every image field's header: a file the loader could not start
to decode stops the pack, named, or is kept on request, counted and named."""
import io
import json

import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

import stoker as stoker_package  # noqa: E402 (the `stoker` fixture is the command line)


def _image(fmt, mode="RGB"):
    buf = io.BytesIO()
    Image.new(mode, (12, 9), 90).save(buf, format=fmt)
    return buf.getvalue()


def _good_folder(src):
    """One real image of each format the loader decodes."""
    files = {"a/photo.jpg": _image("JPEG"), "a/lossless.png": _image("PNG"), "a/alpha.png": _image("PNG", "RGBA"),
             "a/web.webp": _image("WEBP"), "b/scan.tif": _image("TIFF"), "b/grey.pgm": _image("PPM", "L"),
             "b/colour.ppm": _image("PPM"), "b/old.bmp": _image("BMP"), "b/wide.png": _image("PNG", "I;16")}
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    return files


def test_every_format_the_loader_decodes_passes_the_check(tmp_path):
    files = _good_folder(tmp_path / "src")
    summary = stoker_package.pack(tmp_path / "src", tmp_path / "out")
    assert summary["samples"] == len(files)
    assert summary["bad_images_kept"] == 0 and summary["bad_images_named"] == []
    assert "bad_images" not in summary["note"]


@pytest.mark.parametrize("name,data,says", [
    ("empty.jpg", b"", "0 bytes, not an image"),
    ("page.jpg", b"<!DOCTYPE html><html>403 Forbidden</html>", "not an image"),
    ("anim.jpg", _image("GIF"), "a GIF image"),
    ("cut.png", _image("PNG")[:20], "PNG"),
])
def test_a_bad_image_stops_the_command_line_pack_naming_it_and_can_be_kept(stoker, tmp_path, name, data, says):
    _good_folder(tmp_path / "src")
    (tmp_path / "src" / "c").mkdir()
    (tmp_path / "src" / "c" / name).write_bytes(data)
    key = "c/" + name.split(".")[0]
    r = stoker("pack", tmp_path / "src", tmp_path / "out", check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "sample '%s'" % key in r.stderr and str(tmp_path / "src" / "c" / name) in r.stderr, r.stderr
    assert says in r.stderr and "--keep-bad-images" in r.stderr, r.stderr
    assert not (tmp_path / "out" / "index.stoker").exists()

    r = stoker("pack", "--keep-bad-images", tmp_path / "src", tmp_path / "out")
    assert "kept 1 image that the loader cannot decode" in r.stderr and key in r.stderr, r.stderr
    shown = stoker("inspect", tmp_path / "out").stdout
    assert "bad      1 image kept as it was that the loader cannot decode" in shown and key in shown, shown
    r = stoker("verify", tmp_path / "out")  # the bytes are as written: OK, and the kept image said
    assert r.stdout.endswith(": OK\n") and "records 1 image kept as written by keep_bad_images (%s" % key in r.stderr, (
        r.stdout + r.stderr)
    assert json.loads(stoker("verify", "--json", tmp_path / "out").stdout)["bad_images_kept"] == 1
    note = json.loads(stoker("inspect", "--json", tmp_path / "out").stdout)["pack"]
    assert note["bad_images"]["kept"] == 1 and list(note["bad_images"]["named"]) == ["%s, field '%s'" % (
        key, name.split(".")[1])], note


def test_the_python_pack_raises_naming_the_sample_or_keeps_and_names(tmp_path, caplog):
    (tmp_path / "src" / "c").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "src" / "c" / ("%d.jpg" % i)).write_bytes(_image("JPEG"))
    (tmp_path / "src" / "c" / "zero.jpg").write_bytes(b"")
    with pytest.raises(stoker_package.CorruptionError, match="sample 'c/zero'.*0 bytes, not an image"):
        stoker_package.pack(tmp_path / "src", tmp_path / "out")
    with pytest.raises(TypeError):
        stoker_package.pack(tmp_path / "src", tmp_path / "out", keep_bad_images="yes")
    summary = stoker_package.pack(tmp_path / "src", tmp_path / "out", keep_bad_images=True)
    assert summary["bad_images_kept"] == 1
    assert summary["bad_images_named"] == ["c/zero, field 'jpg': 0 bytes, not an image"]
    with caplog.at_level("WARNING", logger="stoker"):
        stoker_package.Loader(tmp_path / "out", batch_size=2, log_epochs=False)
    assert "holds 1 image that the loader cannot decode" in caplog.text and "c/zero, field 'jpg'" in caplog.text
    caplog.clear()
    loader = stoker_package.Loader(tmp_path / "out", batch_size=2, shuffle=False, on_corrupt="skip", log_epochs=False)
    assert "cannot decode" not in caplog.text
    # The loader's own policy: the kept one's place is filled by a good sample, and counted.
    assert sum(len(labels) for _, labels in loader) == 4
    assert loader.stats()["corrupt_skipped"] == 1


def test_indexing_shards_checks_their_images_too(stoker, tmp_path):
    import tarfile
    shard = tmp_path / "shards" / "data-000000.tar"
    shard.parent.mkdir()
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("a.jpg", _image("JPEG")), ("a.cls", b"1"), ("b.jpg", b""), ("b.cls", b"2")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    r = stoker("index", shard.parent, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "data-000000.tar:" in r.stderr and "sample 'b', field 'jpg': 0 bytes, not an image" in r.stderr, r.stderr
    assert not (shard.parent / "index.stoker").exists()
    r = stoker("index", "--keep-bad-images", shard.parent)
    assert "kept 1 image that the loader cannot decode" in r.stderr and "b, field 'jpg'" in r.stderr, r.stderr
    shown = stoker("inspect", shard.parent).stdout
    assert "bad      1 image kept as it was" in shown, shown
