"""End-to-end tests of the stoker CLI: pack, index, inspect, verify, ls."""
import json
import os
import pathlib
import pty
import signal
import subprocess
import time

import pytest
from fake_images import fake_image  # tests/python is on the path


def image_files(root):
    return sorted(p for p in pathlib.Path(root).rglob("*") if p.is_file())


def test_pack_verify_inspect_round_trip(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    r = stoker("pack", demo_images, out, "--shard-size", "1MiB")
    assert "packed 48 samples" in r.stdout
    assert "\r" not in r.stderr, "no progress bar when stderr is not a terminal"
    shards = sorted(out.glob("shard-*.tar"))
    assert len(shards) > 1
    assert all(s.stat().st_size <= 1 << 20 for s in shards)

    r = stoker("verify", out)
    assert r.stdout.rstrip().endswith("OK")

    summary = json.loads(stoker("inspect", out, "--json").stdout)
    assert summary["samples"] == 48
    assert summary["shards"] == len(shards)
    assert summary["field_names"] == ["cls", "jpeg"]
    assert summary["labels"] == {str(c): 8 for c in range(6)}
    assert summary["shard_bytes"] == sum(s.stat().st_size for s in shards)

    assert [(f["name"], f["kind"]) for f in summary["fields"]] == [("cls", "int"), ("jpeg", "image")]
    text = stoker("inspect", out).stdout
    assert "samples  48" in text
    assert "jpeg             image" in text
    # The class folders' names, kept by pack beside each label.
    classes = sorted(p.name for p in demo_images.iterdir() if p.is_dir())
    assert summary["class_names"] == classes and summary["pack"] == {"classes": classes}
    assert "class names kept by pack" in text and "     0:        8 " in text and text.count(classes[5]) == 1

    # --images: the JPEG headers of an even spread of samples, against what PIL reads.
    from PIL import Image
    surveyed = json.loads(stoker("inspect", out, "--json", "--images", "12").stdout)["images"]
    assert surveyed["surveyed"] == 12 and surveyed["jpeg_headers_read"] == 12
    assert surveyed["coding"] == {"baseline 4:2:0": 12}
    assert surveyed["gpu_decode_route"]["hardware"] == 12
    sides = sorted(max(Image.open(p).size) for p in image_files(demo_images)[::4])
    assert surveyed["longest_side"]["max"] == sides[-1]
    text = stoker("inspect", out, "--images", "48").stdout
    assert "longest side" in text and "--max-side 256" in text and 'decode="gpu"' in text

    # Every sample's bytes are exactly the source file's.
    files = image_files(demo_images)
    listed = [json.loads(line) for line in stoker("ls", out, "--json").stdout.splitlines()]
    assert len(listed) == len(files)
    for entry, path in zip(listed, files, strict=True):
        rel = path.relative_to(demo_images)
        assert entry["key"] == str(rel.with_suffix(""))
        jpeg = entry["fields"]["jpeg"]
        with open(out / entry["shard"], "rb") as f:
            f.seek(jpeg["offset"])
            assert f.read(jpeg["size"]) == path.read_bytes()


def test_pack_is_deterministic(stoker, demo_images, tmp_path):
    stoker("pack", demo_images, tmp_path / "a", "--shard-size", "700KiB", "--threads", "1")
    stoker("pack", demo_images, tmp_path / "b", "--shard-size", "700KiB", "--threads", "9")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_gnu_tar_lists_and_extracts_our_shards(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)
    shard = out / "shard-000000.tar"
    listing = subprocess.run(["tar", "-tf", shard], check=True, capture_output=True, text=True).stdout.split()
    files = image_files(demo_images)
    expected = []
    for path in files:
        key = str(path.relative_to(demo_images).with_suffix(""))
        expected += [key + ".cls", key + ".jpeg"]
    assert listing == expected
    extract = tmp_path / "extract"
    extract.mkdir()
    subprocess.run(["tar", "-xf", shard, "-C", extract], check=True)
    for path in files:
        key = path.relative_to(demo_images).with_suffix("")
        assert (extract / (str(key) + ".jpeg")).read_bytes() == path.read_bytes()
        label = sorted(p.name for p in demo_images.iterdir()).index(key.parts[0])
        assert (extract / (str(key) + ".cls")).read_text() == str(label)


def test_flipped_byte_fails_verify_and_names_the_sample(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)
    victim = [json.loads(line) for line in stoker("ls", out, "--json").stdout.splitlines()][17]
    offset = victim["fields"]["jpeg"]["offset"] + 1000
    with open(out / victim["shard"], "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))
    r = stoker("verify", out, check=False)
    assert r.returncode != 0
    first = min(field["offset"] for field in victim["fields"].values())
    assert "%s:%d sample '%s'" % (victim["shard"], first, victim["key"]) in r.stderr, r.stderr
    report = json.loads(stoker("verify", out, "--json", check=False).stdout)
    assert not report["ok"]
    assert victim["key"] in [p["key"] for p in report["problems"]]


def test_interrupted_pack_never_looks_complete(stoker, demo_images, tmp_path):
    # A long manifest (the images hard-linked 200 times over, a shard each:
    # seconds of work) killed as soon as 3 shards are out. (A FIFO no longer
    # blocks pack: it is refused, and a failed pack removes its own shards,
    # which raced with the kill.)
    files = image_files(demo_images)
    links = tmp_path / "links"
    links.mkdir()
    rows = []
    for copy in range(200):
        for i, f in enumerate(files):
            link = links / ("%03d_%03d.jpg" % (copy, i))
            os.link(f, link)
            rows.append("%s,1\n" % link)
    manifest = tmp_path / "list.csv"
    manifest.write_text("path,label\n" + "".join(rows))
    out = tmp_path / "out"
    proc = subprocess.Popen([stoker.binary, "pack", manifest, out, "--shard-size", "4KiB"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while not (out / "shard-000002.tar").exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.002)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "pack ended before it was killed (%s)" % proc.returncode
    assert (out / "shard-000002.tar").exists()
    assert not (out / "index.stoker").exists()
    r = stoker("inspect", out, check=False)
    assert r.returncode != 0 and "has no index.stoker" in r.stderr
    # A rerun (without the stuck file) says the finished shards are in the way
    # and deletes nothing; with --force it replaces them and the dead run's
    # temporaries go.
    shards_before = sorted(p.name for p in out.glob("shard-*.tar"))
    manifest.write_text("path,label\n" + "".join("%s,1\n" % f for f in files))
    r = stoker("pack", manifest, out, "--shard-size", "256KiB", check=False)
    assert r.returncode == 1 and "shard-000000.tar" in r.stderr and "--force" in r.stderr, r.stderr
    assert sorted(p.name for p in out.glob("shard-*.tar")) == shards_before
    stoker("pack", manifest, out, "--shard-size", "256KiB", "--force")
    assert not list(out.glob("*.tmp*"))
    stoker("verify", out)


def test_progress_bar_on_a_terminal(stoker, demo_images, tmp_path):
    leader, follower = pty.openpty()
    proc = subprocess.Popen([stoker.binary, "pack", demo_images, tmp_path / "out", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait() == 0
    os.close(leader)
    text = b"".join(chunks).decode()
    assert "pack [" in text and "48/48 samples" in text and "100%" in text, text


@pytest.mark.parametrize("case", ["empty", "noext", "missing", "not_writable", "manifest_bad", "duplicate_field"])
def test_bad_input_gets_a_clear_error(stoker, tmp_path, case):
    src = tmp_path / "src"
    out = tmp_path / "out"
    if case == "empty":
        src.mkdir()
        expect = "no class sub-folders"
    elif case == "noext":
        (src / "cat").mkdir(parents=True)
        (src / "cat" / "photo").write_bytes(b"x")
        expect = "cat/photo' has no file extension"
    elif case == "missing":
        src = tmp_path / "nowhere"
        expect = "nothing to pack at '%s': no file or folder by that name" % src
    elif case == "not_writable":
        (src / "cat").mkdir(parents=True)
        (src / "cat" / "a.jpg").write_bytes(b"x")
        (tmp_path / "file").write_bytes(b"")
        out = tmp_path / "file" / "out"
        expect = "file/out"
    elif case == "manifest_bad":
        src = tmp_path / "list.csv"
        src.write_text("path,label\na.jpg,1\nb.jpg\n")
        expect = "list.csv:3: row has 1 column, the header has 2"
    elif case == "duplicate_field":
        (tmp_path / "a.jpg").write_bytes(b"x")
        src = tmp_path / "list.csv"
        src.write_text("path,jpg\na.jpg,oops\n")
        expect = "field 'jpg' appears twice"
    r = stoker("pack", src, out, check=False)
    assert r.returncode != 0
    assert "stoker: error:" in r.stderr and expect in r.stderr, r.stderr
    assert not (out / "index.stoker").exists()


@pytest.mark.parametrize("args,hint", [
    (["pakc", "a", "b"], "'pakc' is no command: did you mean 'pack'?"),
    (["gpu", "rn", "--", "true"], "'rn' is no command: did you mean 'run'?"),
    (["pack", "a", "b", "--shard-sise", "1MiB"], "did you mean --shard-size?"),
    (["bench", "a", "--thread", "2"], "did you mean --threads?"),
    (["inspect", "a", "--jsn"], "did you mean --json?"),
    (["xyzzy"], "'xyzzy' is no command (see"),
])
def test_a_misspelt_command_or_option_is_named_with_the_one_meant(stoker, args, hint):
    r = stoker(*args, check=False)
    assert r.returncode == 1 and r.stderr.startswith("stoker: error: invalid argument: "), r.stderr
    assert hint in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_corrupt_or_foreign_index_is_rejected(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)
    index = out / "index.stoker"
    data = bytearray(index.read_bytes())
    data[40] ^= 0xFF
    index.write_bytes(bytes(data))
    r = stoker("inspect", out, check=False)
    assert r.returncode != 0 and "not a valid stoker index" in r.stderr, r.stderr
    index.write_bytes(b"PK\x03\x04 this is a zip file, not an index" * 10)
    r = stoker("verify", out, check=False)
    assert r.returncode != 0 and "bad magic" in r.stderr, r.stderr
    # Corrupt per-sample records are caught by verify (open stays O(1)).
    stoker("pack", demo_images, out, "--force")
    data = bytearray(index.read_bytes())
    data[-3] ^= 0x01  # inside the key section
    index.write_bytes(bytes(data))
    r = stoker("verify", out, check=False)
    assert r.returncode != 0 and "index records checksum mismatch" in r.stderr, r.stderr


def test_bench_reports_each_epoch_as_json(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)
    r = stoker("bench", out, "--epochs", "2", "--batch-size", "8", "--size", "64", "--consumer-ms", "5", "--json")
    epochs = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["epoch"] for e in epochs] == [0, 1]
    for e in epochs:
        assert e["images"] == 48 and e["batches"] == 6
        assert e["images_per_s"] > 0 and e["cpu_s_per_image"] > 0 and e["peak_rss_bytes"] > 0
        assert e["consumer_wait_s"] >= 0 and 0 < e["accelerator_utilization"] <= 1
    text = stoker("bench", out, "--max-batches", "2", "--batch-size", "8", "--size", "64").stdout
    assert "images/s" in text and "batch buffers:" in text
    assert "kernel read-ahead on for the shards: they (" in text  # 48 small images fit any page cache
    off = stoker("bench", out, "--max-batches", "1", "--batch-size", "8", "--size", "64", "--json",
                 "--kernel-readahead", "off").stdout
    assert json.loads(off.splitlines()[-1])["kernel_readahead"] is False
    bad = stoker("bench", out, "--dtype", "int7", check=False)
    assert bad.returncode != 0 and "int7" in bad.stderr


def test_memory_does_not_grow_with_threads_beyond_scratch(stoker, demo_images, tmp_path):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)

    def peak(threads):
        r = stoker("bench", out, "--threads", threads, "--prefetch", "2", "--batch-size", "8", "--json")
        return json.loads(r.stdout.splitlines()[-1])["peak_rss_bytes"]

    one, eight = peak(1), peak(8)
    # Per-thread scratch is a decoded region and a resample buffer (a few MB at
    # most for these images); nothing per thread holds a copy of the dataset.
    assert eight - one < 40 << 20, (one, eight)


def test_package_imports_and_reports_cuda_without_a_gpu():
    import stoker
    status = stoker.cuda_status()
    assert set(status) == {"built_with_cuda", "device_count", "reason"}
    if status["device_count"] == 0:
        assert status["reason"]  # says why: not built with CUDA, no driver, or no device


def test_parse_errors_use_the_documented_format_and_exit_1(stoker, tmp_path):
    for args in (["bench"], ["bench", tmp_path, "--threads", "abc"], ["frobnicate"], ["pack", tmp_path]):
        r = stoker(*args, check=False)
        assert r.returncode == 1, (args, r.returncode)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stoker: error: invalid argument: "), (args, r.stderr)
    assert stoker("--help").returncode == 0
    assert stoker("--version").stdout.startswith("stoker ")


@pytest.mark.parametrize("args, says", [
    (["--consumer-ms", "-5"], "--consumer-ms -5 must be a finite number"),
    (["--consumer-ms", "nan"], "--consumer-ms nan must be a finite number"),
    (["--consumer-ms", "inf"], "--consumer-ms inf must be a finite number"),
    (["--max-attempts", "0"], "--max-attempts"),
    (["--seed", "-1"], "--seed '-1' is not an integer from 0 to 2^64-1"),
    (["--threads", "100000"], "--threads"),
    (["--prefetch", "100000"], "--prefetch"),
    (["--batch-size", "0"], "--batch-size"),
    (["--kernel-readahead", "maybe"], "--kernel-readahead"),
])
def test_bench_refuses_bad_values_before_starting(stoker, demo_images, tmp_path, args, says):
    out = tmp_path / "packed"
    stoker("pack", demo_images, out)
    r = stoker("bench", out, *args, check=False)
    assert r.returncode == 1 and r.stderr.startswith("stoker: error: ") and says in r.stderr, r.stderr


def test_ls_and_verify_print_keys_with_control_characters_escaped(stoker, tmp_path):
    # webdataset reads member names with tabs and newlines; stoker indexes
    # them, and prints each sample on one line.
    import io
    import tarfile
    shard = tmp_path / "odd.tar"
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in (("a\tb.jpg", fake_image("jpg", b"1")), ("c\nd.jpg", fake_image("jpg", b"2")),
                           ("e\x1bf.jpg", fake_image("jpg", b"3"))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    stoker("index", shard)
    lines = stoker("ls", tmp_path / "index.stoker").stdout.splitlines()
    assert len(lines) == 3, lines
    keys = [line.split("\t")[0] for line in lines]
    assert keys == ["a\\tb", "c\\nd", "e\\x1bf"], keys
    # A corrupt sample is named escaped too.
    data = bytearray(shard.read_bytes())
    data[1536 + 25] ^= 0xFF  # the second member's payload, past its 25-byte JPEG header
    shard.write_bytes(bytes(data))
    r = stoker("verify", tmp_path / "index.stoker", check=False)
    assert r.returncode == 1 and "sample 'c\\nd'" in r.stderr, r.stderr
    assert all("\x1b" not in line for line in (r.stdout + r.stderr).splitlines())


def test_threads_and_sizes_are_bounded_everywhere(stoker, demo_images, tmp_path):
    r = stoker("pack", demo_images, tmp_path / "out", "--threads", "100000", check=False)
    assert r.returncode == 1 and "--threads" in r.stderr, r.stderr
