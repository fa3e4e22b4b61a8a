"""The doctor's step accounting on planted stalls with known ground truth (on
the CPU: host clocks only), its verdict, its Prometheus text (parsed by
prometheus-client's parser) and its trace (Trace Event format)."""
import json
import time
import urllib.request

import pytest

from stoker.doctor import CATEGORIES, Doctor

prometheus_parser = pytest.importorskip("prometheus_client.parser")


class Planted:
    """Ground truth: the time each planted stall actually took."""

    def __init__(self):
        self.seconds = {}

    def sleep(self, category, seconds):
        start = time.perf_counter()
        time.sleep(seconds)
        self.seconds[category] = self.seconds.get(category, 0.0) + time.perf_counter() - start


def slow_batches(planted, n, delay):
    for i in range(n):
        planted.sleep("data_wait", delay)
        yield i


def run_loop(planted, steps=20, data_delay=0.0, compute=0.010, checkpoint_every=0, checkpoint=0.200,
             sync=0.0, doctor=None):
    doc = doctor or Doctor(cuda=False)
    for step in doc.batches(slow_batches(planted, steps, data_delay)):
        planted.sleep("compute", compute)
        if sync:
            with doc.phase("sync"):
                planted.sleep("sync", sync)
        if checkpoint_every and step % checkpoint_every == checkpoint_every - 1:
            with doc.phase("checkpoint"):
                planted.sleep("checkpoint", checkpoint)
    doc.close()
    return doc


def assert_recovered(doc, planted):
    account = doc.account()
    # The categories add up to the wall time.
    assert sum(account["seconds"].values()) == pytest.approx(account["wall_s"], rel=1e-9, abs=1e-9)
    misattributed = 0.0
    for category, truth in planted.seconds.items():
        got = account["seconds"][category]
        # Within 10% or 2 ms per step of what was planted (the loop's own overhead is compute here).
        tolerance = max(0.10 * truth, 0.002 * account["steps"])
        assert abs(got - truth) <= tolerance, (category, got, truth, account)
        if category != "compute":
            misattributed += abs(got - truth)
    planted_stalls = sum(v for k, v in planted.seconds.items() if k != "compute")
    if planted_stalls:
        assert misattributed <= 0.05 * planted_stalls + 0.002 * account["steps"], (misattributed, planted_stalls)


@pytest.mark.parametrize("delay", [0.020, 0.050])
def test_a_slow_loader_is_recovered_as_data_wait_and_judged_input_bound(delay):
    planted = Planted()
    doc = run_loop(planted, data_delay=delay)
    assert_recovered(doc, planted)
    share = doc.account()["share"]["data_wait"]
    finding, fix, gain = doc.verdict()[0]
    assert "input-bound" in finding and "%.0f%%" % (100 * share) in finding
    assert "stoker.Loader" in fix  # a plain iterable, not stoker's loader
    # Removing the wait leaves the compute: steps/s grows by wait / (1 - wait).
    assert gain == pytest.approx(share / (1 - share))
    assert "predicted +" in doc.report()


def test_a_synchronous_checkpoint_is_recovered_and_judged():
    planted = Planted()
    doc = run_loop(planted, steps=20, checkpoint_every=10, checkpoint=0.200)
    assert_recovered(doc, planted)
    findings = [f for f, _, _ in doc.verdict()]
    assert any(f.startswith("checkpoint stalls") for f in findings)


def test_sync_stalls_each_step_are_recovered():
    planted = Planted()
    doc = run_loop(planted, steps=20, sync=0.005)
    assert_recovered(doc, planted)
    assert any(f.startswith("synchronisation stalls") for f, _, _ in doc.verdict())


def test_a_compute_bound_loop_gets_no_finding_and_says_what_it_could_not_see():
    planted = Planted()
    doc = run_loop(planted, steps=10)
    assert doc.verdict() == []
    report = doc.report()
    assert "compute-bound" in report
    assert "could not see: GPU time" in report


def test_a_fake_clock_gives_exact_accounts():
    now = [0.0]
    doc = Doctor(cuda=False, clock=lambda: now[0])

    def batches():
        for i in range(3):
            now[0] += 0.030  # data
            yield i
    for _ in doc.batches(batches()):
        now[0] += 0.050  # compute
        with doc.phase("communication"):
            now[0] += 0.020
    doc.close()
    a = doc.account()
    assert a["steps"] == 4  # 3 steps, and the wait that found the end of the data
    assert a["seconds"]["data_wait"] == pytest.approx(0.090)
    assert a["seconds"]["compute"] == pytest.approx(0.150)
    assert a["seconds"]["communication"] == pytest.approx(0.060)
    assert a["wall_s"] == pytest.approx(0.300)


def test_phases_are_checked():
    doc = Doctor(cuda=False)
    with pytest.raises(ValueError, match="phase must be one of"):
        with doc.phase("lunch"):
            pass
    with pytest.raises(RuntimeError, match="do not nest"):
        with doc.phase("sync"):
            with doc.phase("checkpoint"):
                pass


def test_prometheus_text_parses_and_matches_the_account():
    planted = Planted()
    doc = run_loop(planted, steps=10, data_delay=0.005)
    families = {f.name: f for f in prometheus_parser.text_string_to_metric_families(doc.prometheus_text())}
    account = doc.account()
    idle = {s.labels["cause"]: s.value for s in families["stoker_gpu_idle_seconds"].samples}
    assert set(idle) == set(CATEGORIES) - {"compute"}
    assert idle["data_wait"] == pytest.approx(account["seconds"]["data_wait"])
    assert families["stoker_steps"].samples[0].value == account["steps"]
    hist = {s.name: s for s in families["stoker_step_duration_seconds"].samples if "le" not in s.labels}
    assert hist["stoker_step_duration_seconds_count"].value == account["steps"]
    assert hist["stoker_step_duration_seconds_sum"].value == pytest.approx(account["wall_s"])
    buckets = [s for s in families["stoker_step_duration_seconds"].samples if "le" in s.labels]
    assert buckets[-1].labels["le"] == "+Inf" and buckets[-1].value == account["steps"]
    assert all(a.value <= b.value for a, b in zip(buckets, buckets[1:]))


def test_the_metrics_endpoint_serves_the_text():
    doc = run_loop(Planted(), steps=3)
    port = doc.serve(0)
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10) as r:
            body = r.read().decode()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert "stoker_steps_total 4" in body  # 3 steps and the end of the data
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=10)
    finally:
        doc.close()


def test_the_trace_is_trace_event_json_and_bounded():
    planted = Planted()
    doc = Doctor(cuda=False, trace_steps=8)
    run_loop(planted, steps=40, data_delay=0.001, compute=0.001, checkpoint_every=20, checkpoint=0.050, doctor=doc)
    trace = json.loads(doc.chrome_trace())
    events = trace["traceEvents"]
    steps = [e for e in events if e["name"] == "step"]
    assert 8 <= len(steps) <= 16  # the last 8, and the slow ones (the checkpoints') kept beside them
    for e in events:
        assert e["ph"] == "X" and isinstance(e["ts"], (int, float)) and e["dur"] >= 0
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and e["name"]
    assert any(e["name"] == "checkpoint" for e in events), "a slow step around an anomaly is kept in full"
    ts = [e["ts"] for e in steps]
    assert ts == sorted(ts)


def test_with_stoker_loader_and_torch_dataloader(cli, demo_images, tmp_path):
    import torch
    import torchvision

    import stoker
    import stoker.transforms as T
    packed = tmp_path / "packed"
    cli("pack", demo_images, packed)
    loader = stoker.Loader(packed, batch_size=8, num_threads=1, transform=T.Compose([T.RandomResizedCrop(32)]),
                           log_epochs=False)
    with Doctor(cuda=False) as doc:
        for images, labels in doc.batches(loader):
            time.sleep(0.001)
    assert doc.account()["steps"] == len(loader) + 1
    fix = doc._input_fix()
    assert "num_threads" in fix or "threads are saturated" in fix  # it read the loader's own stats

    dataset = torchvision.datasets.ImageFolder(demo_images, transform=torchvision.transforms.Compose(
        [torchvision.transforms.RandomResizedCrop(32), torchvision.transforms.ToTensor()]))
    dl = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=0)
    with Doctor(cuda=False) as doc:
        for images, labels in doc.batches(dl, device="cpu"):
            pass
    assert doc.account()["steps"] == len(dl) + 1
    assert doc.account()["seconds"]["data_wait"] > 0
