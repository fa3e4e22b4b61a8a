"""Remote datasets against real servers on loopback: nginx (ranges, ETags),
moto's S3 server (signed requests), and our fault-injecting proxy."""
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import remote_servers  # noqa: E402

torch = pytest.importorskip("torch")
stoker = pytest.importorskip("stoker")


@pytest.fixture(scope="module")
def packed(tmp_path_factory, demo_images, stoker_bin):
    out = tmp_path_factory.mktemp("remote") / "packed"
    subprocess.run([stoker_bin, "pack", str(demo_images), str(out), "--shard-size", "512KiB"], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def nginx(packed):
    server = remote_servers.Nginx(packed)
    yield server
    server.close()


@pytest.fixture()
def proxy(nginx):
    p = remote_servers.FaultProxy(nginx.url)
    yield p
    p.close()


def shard_names(folder):
    return sorted(p.name for p in pathlib.Path(folder).glob("*.tar"))


def shard_bytes(folder):
    return sum(p.stat().st_size for p in pathlib.Path(folder).glob("*.tar"))


def batches(location, epochs=1, **kw):
    options = dict(batch_size=8, seed=3, dtype="uint8", order="shard_block", shard_window=2, num_threads=2,
                   log_epochs=False)
    options.update(kw)
    loader = stoker.Loader(str(location), with_indices=True, **options)
    out = []
    for _ in range(epochs):
        for images, labels, indices in loader:
            out.append((images.clone(), labels.clone(), indices.clone()))
    return out, loader


def assert_same(a, b):
    assert len(a) == len(b)
    for (x1, y1, i1), (x2, y2, i2) in zip(a, b, strict=True):
        assert torch.equal(i1, i2) and torch.equal(y1, y2) and torch.equal(x1, x2)


def test_http_loader_yields_exactly_the_local_batches_through_a_small_cache(packed, nginx, tmp_path):
    local, _ = batches(packed, epochs=2, batch_size=4, shard_window=1)
    # Room for six of the dataset's ten shards: evictions are needed every
    # epoch (the batches in flight read up to five at once).
    cap = 6 * max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    remote, loader = batches(nginx.url, epochs=2, batch_size=4, cache_dir=tmp_path / "cache", cache_size=cap,
                             shard_window=1)
    assert_same(local, remote)
    st = loader.remote_stats()
    assert st["downloads"] >= len(shard_names(packed)), st
    assert st["evictions"] > 0 and st["retries"] == 0, st
    assert st["hits"] > 0
    cached = [p for p in (tmp_path / "cache").iterdir() if p.name.endswith(".shard")]
    assert sum(p.stat().st_size for p in cached) <= cap


def test_http_dict_batches_are_the_local_ones(packed, nginx, tmp_path):
    """Typed fields over HTTP through a cache smaller than the data: the same dict batches as the local
    dataset's (image untransformed, label, raw bytes), with the index's recorded kinds read remotely."""
    fields = {"image": stoker.Image(transform=None), "label": stoker.Int("cls"), "raw": stoker.Bytes("cls")}

    def dicts(location, **kw):
        loader = stoker.Loader(str(location), batch_size=4, seed=3, order="shard_block", shard_window=1,
                               num_threads=2, log_epochs=False, with_indices=True, fields=fields, **kw)
        return [{k: (v.clone() if torch.is_tensor(v) else [t.clone() for t in v] if k == "image" else list(v))
                 for k, v in batch.items()} for batch in loader]

    cap = 6 * max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    local = dicts(packed)
    remote = dicts(nginx.url, cache_dir=tmp_path / "cache", cache_size=cap)
    assert len(local) == len(remote) == 12
    for a, b in zip(local, remote, strict=True):
        assert torch.equal(a["__index__"], b["__index__"]) and torch.equal(a["label"], b["label"])
        assert a["raw"] == b["raw"] and all(torch.equal(x, y) for x, y in zip(a["image"], b["image"], strict=True))
    with pytest.raises(ValueError, match="records as image"):
        stoker.Loader(nginx.url, batch_size=4, fields={"x": stoker.Array("jpeg")}, cache_dir=tmp_path / "cache",
                      cache_size=cap, log_epochs=False)


def test_cli_inspect_verify_and_bench_accept_urls(stoker, packed, nginx, tmp_path):
    cache = ["--cache-dir", tmp_path / "c", "--cache-size", "64MiB"]
    out = stoker("inspect", nginx.url, "--json", *cache).stdout
    assert json.loads(out)["samples"] == 48
    stoker("verify", nginx.url, *cache)
    lines = stoker("bench", nginx.url + "/", "--epochs", "2", "--json", "--batch-size", "8", "--order", "shard-block",
                   *cache).stdout.strip().splitlines()
    epochs = [json.loads(line) for line in lines]
    assert [e["epoch"] for e in epochs] == [0, 1]
    # Verify already fetched everything into the (large enough) cache.
    assert epochs[0]["bytes_downloaded"] == 0 and epochs[0]["cache_hit_rate"] == 1.0
    st = json.loads(stoker("cache", "stat", "--json", *cache[:2]).stdout)
    assert st["entries"] == len(shard_names(packed)) and st["bytes"] == shard_bytes(packed)
    st = json.loads(stoker("cache", "clear", "--json", *cache[:2]).stdout)
    assert st["entries"] == 0 and st["bytes"] == 0


def test_order_auto_picks_shard_block_for_a_small_cache_and_reads_each_shard_once(cli, demo_images, tmp_path, caplog):
    # Packed with --shuffle: shards mix classes, so a shard-aware order's batches are varied.
    packed = tmp_path / "mixed"
    cli("pack", demo_images, packed, "--shard-size", "512KiB", "--shuffle")
    total, shards = shard_bytes(packed), len(shard_names(packed))
    largest = max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    nginx = remote_servers.Nginx(packed)
    try:
        with caplog.at_level(logging.INFO, logger="stoker"):
            loader = stoker.Loader(nginx.url, batch_size=4, dtype="uint8", num_threads=2, log_epochs=False,
                                   cache_dir=tmp_path / "cache", cache_size=6 * largest)
        run_epochs_and_check(loader, caplog, total, shards, largest)
    finally:
        nginx.close()


def run_epochs_and_check(loader, caplog, total, shards, largest):
    st = loader.stats()
    assert st["order"] == "shard_block" and st["shard_window"] >= 1, st
    assert "order=shard_block (auto: the cache is smaller than the dataset)" in caplog.text, caplog.text
    assert st["predicted_epoch_download_bytes"] == total and not st["order_warning"]
    for _ in range(3):
        assert sum(len(labels) for _, labels in loader) == 48
    rs = loader.remote_stats()
    # Each shard once per epoch; the next epoch's first shards may come ahead.
    assert rs["bytes_downloaded"] <= 3 * total + 6 * largest, (rs, total)
    assert rs["over_capacity"] == 0, rs
    assert shards >= 6


def test_shard_block_over_shards_of_one_class_each_is_warned_about(cli, demo_images, tmp_path, caplog):
    # Packed in class order into shards of about eight images: one class per shard (eight images a class).
    packed = tmp_path / "by-class"
    cli("pack", demo_images, packed, "--shard-size", "700KiB")
    largest = max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    assert len(shard_names(packed)) >= 6
    nginx = remote_servers.Nginx(packed)
    try:
        with caplog.at_level(logging.WARNING, logger="stoker"):
            loader = stoker.Loader(nginx.url, batch_size=8, log_epochs=False, cache_dir=tmp_path / "cache",
                                   cache_size=6 * largest)
        st = loader.stats()
        assert st["order"] == "shard_block" and st["order_warning"], st
        assert "labels on average against" in caplog.text and "stoker pack --shuffle" in caplog.text, caplog.text
    finally:
        nginx.close()


def test_a_global_shuffle_through_a_small_cache_is_predicted_and_warned(cli, packed, nginx, tmp_path, caplog):
    total = shard_bytes(packed)
    largest = max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    with caplog.at_level(logging.WARNING, logger="stoker"):
        loader = stoker.Loader(nginx.url, batch_size=8, order="shuffle", log_epochs=False,
                               cache_dir=tmp_path / "cache", cache_size=3 * largest)
    st = loader.stats()
    assert st["order"] == "shuffle" and st["order_warning"] and st["predicted_epoch_download_bytes"] > 1.5 * total
    assert "an epoch is predicted to download" in caplog.text and 'order="shard_block"' in caplog.text, caplog.text
    # The command line says it before the run, and after an epoch that downloaded over 1.5x the dataset.
    r = cli("bench", nginx.url, "--epochs", "1", "--batch-size", "8", "--order", "shuffle", "--cache-dir",
            tmp_path / "cli", "--cache-size", str(3 * largest))
    assert "warning: order=shuffle" in r.stderr and "epoch 0 downloaded" in r.stderr, r.stderr
    assert "use --order auto or shard-block" in r.stderr


def test_a_cache_too_small_for_the_order_is_refused_with_the_sizes(cli, packed, nginx, tmp_path):
    largest = max(p.stat().st_size for p in pathlib.Path(packed).glob("*.tar"))
    with pytest.raises(ValueError, match="reads up to .* shards at once .* smallest cache that works"):
        stoker.Loader(nginx.url, batch_size=8, cache_dir=tmp_path / "c1", cache_size=3 * largest)
    r = cli("bench", nginx.url, "--epochs", "1", "--cache-dir", tmp_path / "c2", "--cache-size", str(largest // 2),
            check=False)
    assert r.returncode != 0 and "smallest cache that works" in r.stderr and "largest" in r.stderr, r.stderr


def test_missing_dataset_and_shard_are_named(stoker, packed, proxy, tmp_path):
    r = stoker("inspect", proxy.url + "/nothing-here", "--cache-dir", tmp_path, check=False)
    assert r.returncode != 0 and "nothing-here" in r.stderr and "no index.stoker" in r.stderr, r.stderr
    first = shard_names(packed)[0]
    proxy.add_fault(first, "status", code=404)
    r = stoker("verify", proxy.url, "--cache-dir", tmp_path, check=False)
    assert r.returncode != 0 and proxy.url + "/" + first in r.stderr and "HTTP 404" in r.stderr, r.stderr
    assert proxy.requests["/" + first] == 1, "a 404 is final: no retries"


FAULTS = [
    ("status", dict(code=503, retry_after=0)),
    ("status", dict(code=429, retry_after=0)),
    ("status", dict(code=500)),
    ("reset", dict(after=100000)),
    ("truncate", dict(after=70000)),
    ("stall", dict(seconds=4)),
    ("corrupt", dict(offset=12345)),
]


@pytest.mark.parametrize("kind,args", FAULTS, ids=[f[0] + "-" + str(f[1].get("code", "")) for f in FAULTS])
def test_faults_are_retried_and_never_reach_the_samples(packed, proxy, tmp_path, kind, args):
    local, _ = batches(packed)
    first = shard_names(packed)[0]
    proxy.add_fault(first, kind, **args)
    remote, loader = batches(proxy.url, cache_dir=tmp_path / "cache", cache_size="64MiB", stall_timeout_seconds=1)
    assert_same(local, remote)
    assert proxy.requests["/" + first] >= 2, proxy.requests
    assert loader.remote_stats()["retries"] >= 1


def test_resume_uses_range_and_if_match(packed, proxy, tmp_path):
    first = shard_names(packed)[0]
    proxy.add_fault(first, "truncate", after=50000)
    batches(proxy.url, cache_dir=tmp_path / "cache")
    headers = proxy.headers["/" + first]
    assert headers.get("Range") == "bytes=50000-", headers
    assert headers.get("If-Match", "").startswith('"'), headers


def test_server_ignoring_ranges_is_handled(packed, proxy, tmp_path):
    first = shard_names(packed)[0]
    proxy.add_fault(first, "truncate", after=50000)
    proxy.add_fault(first, "ignore_range")
    local, _ = batches(packed)
    remote, _ = batches(proxy.url, cache_dir=tmp_path / "cache")
    assert_same(local, remote)


def test_object_changed_while_resuming_starts_over(packed, proxy, tmp_path):
    first = shard_names(packed)[0]
    proxy.add_fault(first, "truncate", after=50000)
    proxy.add_fault(first, "change_etag")  # nginx then answers 412 to If-Match... or the proxy reports a new ETag
    local, _ = batches(packed)
    remote, loader = batches(proxy.url, cache_dir=tmp_path / "cache")
    assert_same(local, remote)
    assert proxy.requests["/" + first] >= 3


def test_persistent_errors_name_the_url(stoker, packed, proxy, tmp_path):
    first = shard_names(packed)[0]
    for _ in range(10):
        proxy.add_fault(first, "status", code=500)
    r = stoker("verify", proxy.url, "--cache-dir", tmp_path / "a", "--max-attempts", "3", check=False)
    assert r.returncode != 0
    assert first in r.stderr and "gave up after 3 attempts" in r.stderr and "HTTP 500" in r.stderr, r.stderr
    # A body that never matches the index is refused, naming the checksum.
    for _ in range(4):
        proxy.add_fault(first, "corrupt", offset=999)
    r = stoker("verify", proxy.url, "--cache-dir", tmp_path / "b", check=False)
    assert r.returncode != 0 and "differs from the index" in r.stderr and first in r.stderr, r.stderr
    assert not list((tmp_path / "b").glob("*-%s.shard" % first)), "nothing corrupt may enter the cache"
    assert list((tmp_path / "b").glob("*.shard")), "the intact shards are cached"


def test_crash_mid_download_leaves_a_usable_cache(stoker_bin, stoker, packed, nginx, tmp_path):
    slow = remote_servers.FaultProxy(nginx.url, bandwidth=400_000)
    cache = tmp_path / "cache"
    try:
        proc = subprocess.Popen([stoker_bin, "cache", "warm", slow.url, "--cache-dir", str(cache), "--connections",
                                 "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and not any(".part-" in p.name for p in cache.glob("*")):
            time.sleep(0.02)
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        st = json.loads(stoker("cache", "stat", "--json", "--cache-dir", cache).stdout)
        assert st["partial_files"] >= 1, st
        assert st["entries"] < len(shard_names(packed))
        # The next user cleans up after the dead process and reads everything intact.
        stoker("verify", nginx.url, "--cache-dir", cache)
        st = json.loads(stoker("cache", "stat", "--json", "--cache-dir", cache).stdout)
        assert st["partial_files"] == 0 and st["entries"] == len(shard_names(packed)), st
    finally:
        slow.close()


def test_processes_sharing_a_cache_download_each_shard_once(stoker_bin, stoker, packed, nginx, tmp_path):
    slow = remote_servers.FaultProxy(nginx.url, bandwidth=3_000_000)
    cache = tmp_path / "cache"
    try:
        procs = [subprocess.Popen([stoker_bin, "cache", "warm", slow.url, "--cache-dir", str(cache)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(3)]
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        for name in shard_names(packed):
            assert slow.requests["/" + name] == 1, slow.requests
        st = json.loads(stoker("cache", "stat", "--json", "--cache-dir", cache).stdout)
        assert st["entries"] == len(shard_names(packed)) and st["partial_files"] == 0
    finally:
        slow.close()


def test_closing_a_loader_abandons_stalled_downloads_promptly(stoker_bin, packed, proxy, tmp_path):
    # Every shard stalls far longer than the test may wait; the proxy runs in
    # this process, so closing must not hold the GIL while the cache stops.
    for name in shard_names(packed):
        proxy.add_fault(name, "stall", seconds=60)
    loader = stoker.Loader(proxy.url, batch_size=8, cache_dir=tmp_path / "cache", stall_timeout_seconds=120.0,
                           log_epochs=False)
    deadline = time.time() + 10
    while not any(proxy.requests.get("/" + name) for name in shard_names(packed)) and time.time() < deadline:
        time.sleep(0.05)  # until downloads (and the loader's reads) are waiting
    time.sleep(0.3)
    start = time.perf_counter()
    del loader
    assert time.perf_counter() - start < 10
    stat = subprocess.run([stoker_bin, "cache", "stat", "--json", "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, check=True)
    st = json.loads(stat.stdout)
    assert st["entries"] == 0 and st["partial_files"] == 0, st


def test_https_downloads_are_multiplexed_over_one_http2_connection(stoker_bin, stoker, packed, tmp_path):
    server = remote_servers.Nginx(packed, tls=True)
    try:
        cache = ["--cache-dir", str(tmp_path / "cache")]
        # A self-signed certificate is refused, at once and by name.
        r = subprocess.run([stoker_bin, "inspect", server.url, *cache], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "CURL_CA_BUNDLE" in r.stderr and server.url in r.stderr, r.stderr
        assert "gave up" not in r.stderr
        env = dict(os.environ, CURL_CA_BUNDLE=server.cert)
        out = subprocess.run([stoker_bin, "bench", server.url, "--epochs", "1", "--json", "--batch-size", "8",
                              "--connections", "8", *cache], capture_output=True, text=True, env=env, timeout=120)
        assert out.returncode == 0, out.stderr
        epoch = json.loads(out.stdout.strip().splitlines()[-1])
        assert epoch["images"] == 48
        shards = [req for req in server.requests() if req[2].endswith(".tar")]
        # Every shard once, all over HTTP/2, all on one connection (the index's).
        assert sorted(req[2] for req in shards) == ["/" + name for name in shard_names(packed)], shards
        assert {req[0] for req in shards} == {"HTTP/2.0"} and {req[3] for req in shards} == {"200"}
        assert len({req[1] for req in server.requests()}) == 1, server.requests()
        assert epoch["connections_opened"] == 0, epoch
    finally:
        server.close()


@pytest.fixture(scope="module")
def moto_s3(packed):
    pytest.importorskip("moto")
    server = remote_servers.MotoS3()
    server.upload_folder("training-data", "imagenet/train", packed)
    yield server
    server.close()


def test_s3_requests_are_signed_and_read(stoker, packed, moto_s3, tmp_path, monkeypatch):
    recorder = remote_servers.FaultProxy(moto_s3.url)
    try:
        env = dict(os.environ, AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1",
                   AWS_ENDPOINT_URL=recorder.url)
        out = stoker("inspect", "s3://training-data/imagenet/train", "--json", "--cache-dir", tmp_path, env=env).stdout
        assert json.loads(out)["samples"] == 48
        auth = recorder.headers["/training-data/imagenet/train/index.stoker"].get("Authorization", "")
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=test/") and "/us-east-1/s3/aws4_request" in auth, auth
        stoker("verify", "s3://training-data/imagenet/train", "--cache-dir", tmp_path, env=env)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        local, _ = batches(packed)
        remote, _ = batches("s3://training-data/imagenet/train", cache_dir=tmp_path / "py")
        assert_same(local, remote)
        # Without credentials: a clear error, no request.
        bare = {k: v for k, v in env.items() if not k.startswith("AWS_ACCESS") and not k.startswith("AWS_SECRET")}
        r = stoker("inspect", "s3://training-data/imagenet/train", "--cache-dir", tmp_path, env=bare, check=False)
        assert r.returncode != 0 and "AWS_ACCESS_KEY_ID" in r.stderr, r.stderr
    finally:
        recorder.close()


def test_a_failing_shard_fails_its_readers_fast_not_once_per_sample(stoker_bin, packed, proxy, tmp_path):
    shard = shard_names(packed)[1]
    for _ in range(500):
        proxy.add_fault(shard, "status", code=500)
    start = time.time()
    r = subprocess.run([stoker_bin, "bench", proxy.url, "--cache-dir", str(tmp_path / "cache"), "--max-attempts", "3",
                        "--threads", "2", "--batch-size", "4", "--order", "sequential", "--epochs", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "HTTP 500" in r.stderr and shard in r.stderr, r.stderr
    assert time.time() - start < 30
    # One cycle of read-ahead, one for the reader that needed it; then its
    # other samples fail at once.
    assert proxy.requests["/" + shard] <= 6, proxy.requests


def test_an_index_claiming_more_than_the_cache_may_hold_is_refused_at_its_header(stoker_bin, tmp_path):
    folder = tmp_path / "evil"
    folder.mkdir()
    header = bytearray(b"STKINDEX" + bytes(120))
    header[16:24] = (1 << 62).to_bytes(8, "little")
    (folder / "index.stoker").write_bytes(bytes(header) + bytes(4 << 20))
    server = remote_servers.Nginx(folder)
    try:
        start = time.time()
        r = subprocess.run([stoker_bin, "inspect", server.url, "--cache-dir", str(tmp_path / "cache"),
                            "--cache-size", "10MiB"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "more than the cache may hold" in r.stderr, r.stderr
        assert time.time() - start < 10
        cached = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
        assert cached < (1 << 20)
    finally:
        server.close()


def test_secrets_in_urls_never_reach_the_output_and_query_strings_survive(stoker_bin, packed, proxy, tmp_path):
    url = proxy.url.replace("http://", "http://alice:hunter2@") + "/?token=abc123"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    r = subprocess.run([stoker_bin, "inspect", url, *cache], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout + r.stderr and "abc123" not in r.stdout + r.stderr
    assert "alice:***@" in r.stdout and "token=***" in r.stdout, r.stdout
    r = subprocess.run([stoker_bin, "bench", url, "--max-batches", "2", "--batch-size", "4", *cache],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    # The index and the shards were asked for with the query string kept.
    assert proxy.requests["/index.stoker?token=abc123"] == 2, proxy.requests  # once per command
    assert any(path.endswith(".tar?token=abc123") for path in proxy.requests), proxy.requests
    missing = url.replace("/?token", "/nothing/?token")
    r = subprocess.run([stoker_bin, "inspect", missing, "--max-attempts", "1", *cache], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "404" in r.stderr, r.stderr
    assert "hunter2" not in r.stderr and "abc123" not in r.stderr and "alice:***@" in r.stderr, r.stderr


def test_a_redirect_is_named_with_where_it_points(stoker_bin, packed, proxy, tmp_path):
    proxy.add_fault("index.stoker", "status", code=302, location="http://elsewhere.example/data/index.stoker?sig=s3")
    r = subprocess.run([stoker_bin, "inspect", proxy.url, "--cache-dir", str(tmp_path / "cache")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r.stderr
    assert "HTTP 302 (a redirect to http://elsewhere.example/data/index.stoker?sig=***" in r.stderr, r.stderr


def test_ctrl_c_interrupts_a_loader_waiting_for_data(packed, proxy, tmp_path):
    for name in shard_names(packed):
        for _ in range(4):
            proxy.add_fault(name, "stall", seconds=60)
    # torch is imported before "ready", as a training script has it: a SIGINT landing inside torch's own
    # import (the loader's first batch imports it) aborts in torch's C++ init, not in stoker's wait.
    # Python installs its KeyboardInterrupt handler only when SIGINT is not ignored at start, and a shell
    # starts background jobs (`scripts/test &`, nohup) with SIGINT ignored: the script asks for the handler
    # a training script run from a terminal has.
    script = textwrap.dedent("""
        import signal, sys, torch, stoker
        signal.signal(signal.SIGINT, signal.default_int_handler)
        loader = stoker.Loader(sys.argv[1], batch_size=4, num_threads=1, cache_dir=sys.argv[2],
                               stall_timeout_seconds=120, log_epochs=False)
        print("ready", flush=True)
        try:
            next(iter(loader))
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, proxy.url, str(tmp_path / "cache")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        start = time.time()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert "interrupted" in out, err
        assert proc.returncode == 3, err
        assert time.time() - start < 15
    finally:
        if proc.poll() is None:
            proc.kill()


class _SlowServer:
    """Answers index.stoker from `packed` at once and shards badly: "silent"
    accepts and never sends a byte; "trickle" sends headers, then 4 KiB/s
    (above the stall threshold, so only the total deadline can end it)."""

    def __init__(self, packed, mode):
        import http.server
        import threading
        root = pathlib.Path(packed)

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                body = (root / self.path.lstrip("/")).read_bytes()
                if self.path.endswith("index.stoker"):
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if mode == "silent":
                    time.sleep(120)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(0, len(body), 512):
                        self.wfile.write(body[i:i + 512])
                        self.wfile.flush()
                        time.sleep(0.125)
                except OSError:
                    pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode,args,says", [
    ("silent", ["--stall-timeout", "2"], "too slow"),
    ("trickle", ["--stall-timeout", "30", "--fetch-deadline", "3"], "deadline"),
])
def test_silent_and_trickling_servers_end_within_the_deadlines(stoker_bin, packed, tmp_path, mode, args, says):
    server = _SlowServer(packed, mode)
    try:
        start = time.time()
        r = subprocess.run([stoker_bin, "bench", server.url, "--cache-dir", str(tmp_path / "cache"), "--max-attempts",
                            "2", "--threads", "1", "--batch-size", "4", "--epochs", "1", *args],
                           capture_output=True, text=True, timeout=120)
        elapsed = time.time() - start
        assert r.returncode == 1 and says in r.stderr and server.url in r.stderr, r.stderr
        assert elapsed < 20, elapsed  # not one download after another
    finally:
        server.close()


def test_a_megatron_corpus_over_http_gives_the_local_batches_through_a_small_cache(cli, tmp_path):
    import numpy as np
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 50000, int(rng.integers(0, 3000))) for _ in range(300)]
    (tmp_path / "www").mkdir()
    stoker.write_tokens(tmp_path / "www" / "corpus", docs, "uint16")
    bin_size = (tmp_path / "www" / "corpus.bin").stat().st_size
    server = remote_servers.Nginx(tmp_path / "www")
    try:
        def epochs(prefix, **kw):
            loader = stoker.TokenLoader(prefix, seq_len=1024, global_batch_size=4, seed=9, with_indices=True, **kw)
            out = []
            for epoch in range(2):
                loader.set_epoch(epoch)
                out += [(b["input_ids"].clone(), b["labels"].clone(), b["documents"]) for b in loader]
            return out, loader
        local, _ = epochs(tmp_path / "www" / "corpus")
        remote, loader = epochs(server.url + "/corpus", cache_dir=tmp_path / "cache", cache_size=4 * 65536,
                                chunk_size="64KiB", read_ahead_batches=4)
        assert bin_size > 8 * 65536  # the cache holds under half of it
        assert len(remote) == len(local)
        for (a, b, c), (x, y, z) in zip(local, remote, strict=True):
            assert torch.equal(a, x) and torch.equal(b, y) and c == z
        stats = loader.remote_stats()[0]
        assert stats["downloads"] >= bin_size // 65536 and stats["evictions"] > 0, stats
        with pytest.raises(FileNotFoundError, match="corpus-missing.idx"):
            stoker.TokenLoader(server.url + "/corpus-missing", seq_len=8, cache_dir=tmp_path / "cache")
        # The command line tells a URL prefix from a packed dataset's URL by opening it.
        for where in ("/corpus", "/corpus.idx"):
            out = json.loads(cli("inspect", server.url + where, "--json", "--cache-dir", tmp_path / "cache").stdout)
            assert (out["documents"], out["tokens"]) == (300, sum(len(d) for d in docs))
        checked = cli("verify", server.url + "/corpus", "--vocab-size", "50000", "--cache-dir", tmp_path / "cache")
        assert "checked 300 documents" in checked.stdout and checked.stdout.rstrip().endswith(": OK")
        missing = cli("inspect", server.url + "/corpus-missing", "--cache-dir", tmp_path / "cache", check=False)
        assert missing.returncode == 1 and "index.stoker" in missing.stderr  # the packed dataset's error stands
        assert "nor a Megatron token dataset's prefix (no %s/corpus-missing.idx there)" % server.url in missing.stderr
    finally:
        server.close()


def test_a_megatron_corpus_on_s3_is_read_with_signed_ranged_requests(moto_s3, tmp_path, monkeypatch):
    import numpy as np
    rng = np.random.default_rng(6)
    docs = [rng.integers(0, 30000, int(rng.integers(0, 2000))) for _ in range(120)]
    (tmp_path / "lm").mkdir()
    stoker.write_tokens(tmp_path / "lm" / "corpus", docs, "uint16")
    moto_s3.upload_folder("training-data", "lm", tmp_path / "lm")
    recorder = remote_servers.FaultProxy(moto_s3.url)
    try:
        for k, v in dict(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_REGION="us-east-1",
                         AWS_ENDPOINT_URL=recorder.url).items():
            monkeypatch.setenv(k, v)

        def epoch(prefix, **kw):
            loader = stoker.TokenLoader(prefix, seq_len=512, global_batch_size=4, seed=2, **kw)
            return [b["input_ids"].clone() for b in loader]
        local = epoch(tmp_path / "lm" / "corpus")
        remote = epoch("s3://training-data/lm/corpus", cache_dir=tmp_path / "cache", chunk_size="64KiB")
        assert len(local) == len(remote) and all(torch.equal(a, b) for a, b in zip(local, remote))
        headers = recorder.headers["/training-data/lm/corpus.bin"]
        assert headers.get("Authorization", "").startswith("AWS4-HMAC-SHA256 Credential=test/"), headers
        assert headers.get("Range", "").startswith("bytes="), headers
    finally:
        recorder.close()
