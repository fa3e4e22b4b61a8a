"""The doctor's step accounting on planted stalls with known ground truth (on
the CPU: host clocks only), its verdict, its Prometheus text (parsed by
prometheus-client's parser) and its trace (Trace Event format). On a fake
GPU queue: test_doctor_gpu.py."""
import json
import math
import os
import time
import urllib.request

import pytest

from stoker.doctor import CATEGORIES, Doctor, _advice
from stoker.doctor.testing import Planted

prometheus_parser = pytest.importorskip("prometheus_client.parser")


def slow_batches(planted, n, delay):
    for i in range(n):
        if delay:
            planted.sleep("data_wait", delay)
        yield i


def run_loop(planted, steps=20, data_delay=0.0, compute=0.010, checkpoint_every=0, checkpoint=0.200,
             sync=0.0, doctor=None):
    doc = doctor or Doctor(cuda=False, warmup_steps=0)
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
    finding, fix, _ = [f for f in doc.verdict() if f[0].startswith("checkpoint stalls")][0]
    assert "2 saves" in finding
    # Young's interval at the measured cost of a save (0.2 s planted, a little more on a loaded machine) and a
    # 24 h MTBF: sqrt(2 x 0.2 x 86400) = 186 s.
    per_save = doc.account()["seconds"]["checkpoint"] / 2
    assert 0.2 <= per_save < 0.25
    assert "save every %.0f s" % math.sqrt(2 * per_save * 86400) in fix, fix


def test_sync_stalls_each_step_are_recovered():
    planted = Planted()
    doc = run_loop(planted, steps=20, sync=0.005)
    assert_recovered(doc, planted)
    assert any(f.startswith("host synchronisation") for f, _, _ in doc.verdict())


def test_a_compute_bound_loop_gets_no_finding_and_says_what_it_could_not_see():
    planted = Planted()
    doc = run_loop(planted, steps=10)
    assert doc.verdict() == []
    report = doc.report()
    assert "compute-bound" in report
    assert "could not see: GPU timing" in report


def test_a_fake_clock_gives_exact_accounts():
    now = [0.0]
    doc = Doctor(cuda=False, clock=lambda: now[0], warmup_steps=0)

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
    assert a["steps"] == 3  # the wait that found the end of the data counts in the time, not as a step
    assert a["seconds"]["data_wait"] == pytest.approx(0.090)
    assert a["seconds"]["compute"] == pytest.approx(0.150)
    assert a["seconds"]["communication"] == pytest.approx(0.060)
    assert a["wall_s"] == pytest.approx(0.300)


def test_phases_are_checked():
    doc = Doctor(cuda=False, warmup_steps=0)
    with pytest.raises(ValueError, match="phase must be one of"):
        with doc.phase("lunch"):
            pass
    # A phase inside another belongs to the outer one (a hooked torch.save inside the program's own
    # checkpoint phase), and outside a step a phase counts nothing: neither raises.
    now = [0.0]
    doc = Doctor(cuda=False, clock=lambda: now[0], warmup_steps=0)
    with doc.phase("sync"):
        now[0] += 1.0
    for _ in doc.batches(range(2)):
        with doc.phase("checkpoint"):
            now[0] += 0.5
            with doc.phase("sync"):
                now[0] += 0.25
    doc.close()
    a = doc.account()
    assert a["seconds"]["checkpoint"] == pytest.approx(1.5) and a["seconds"]["sync"] == 0.0
    assert a["wall_s"] == pytest.approx(1.5)


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
        assert "stoker_steps_total 3" in body
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen("http://127.0.0.1:%d/other" % port, timeout=10)
    finally:
        doc.close()


def test_the_trace_is_trace_event_json_and_bounded():
    planted = Planted()
    doc = Doctor(cuda=False, trace_steps=8, warmup_steps=0)
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
    with Doctor(cuda=False, warmup_steps=0) as doc:
        for images, labels in doc.batches(loader):
            time.sleep(0.001)
    assert doc.account()["steps"] == len(loader)
    fix = _advice._input_fix(doc)
    assert "num_threads" in fix or "threads are saturated" in fix  # it read the loader's own stats

    # Dict batches (typed fields): counted the same, moved whole (lists stay lists), the loader's stats read.
    fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(32)])), "raw": stoker.Image(transform=None),
              "label": stoker.Int("cls")}
    loader = stoker.Loader(packed, batch_size=8, num_threads=1, fields=fields, log_epochs=False)
    with Doctor(cuda=False, warmup_steps=0) as doc:
        for batch in doc.batches(loader, device="cpu"):
            assert set(batch) == {"image", "raw", "label"} and isinstance(batch["raw"], list)
            time.sleep(0.001)
    assert doc.account()["steps"] == len(loader)
    assert doc.account()["seconds"]["data_wait"] > 0
    fix = _advice._input_fix(doc)
    assert "num_threads" in fix or "threads are saturated" in fix

    dataset = torchvision.datasets.ImageFolder(demo_images, transform=torchvision.transforms.Compose(
        [torchvision.transforms.RandomResizedCrop(32), torchvision.transforms.ToTensor()]))
    dl = torch.utils.data.DataLoader(dataset, batch_size=8, num_workers=0)
    with Doctor(cuda=False, warmup_steps=0) as doc:
        for images, labels in doc.batches(dl, device="cpu"):
            pass
    assert doc.account()["steps"] == len(dl)
    assert doc.account()["seconds"]["data_wait"] > 0


TRAIN_SCRIPT = """
import sys, time, torch
class Slow(torch.utils.data.Dataset):
    def __len__(self): return 48
    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.zeros(3, 8, 8), i % 2
model = torch.nn.Linear(192, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(2):
    for step, (x, y) in enumerate(torch.utils.data.DataLoader(Slow(), batch_size=8)):
        loss = torch.nn.functional.cross_entropy(model(x.flatten(1)), y)
        loss.backward(); opt.step(); opt.zero_grad()
        time.sleep(0.002)
        loss.item()
        if step == 2:
            torch.save(model.state_dict(), sys.argv[1])
sys.exit(3)
"""


def test_stoker_doctor_runs_a_script_unchanged_and_reports(stoker_bin, tmp_path):
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    out = tmp_path / "doctor"
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0", TMPDIR=str(temp))
    run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--", sys.executable, str(script),
                          str(tmp_path / "ckpt.pt")], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 3, run.stderr  # the command's own status
    assert list(temp.iterdir()) == []  # the folder that attached the doctor went with the command
    assert "input-bound" in run.stdout, run.stdout + run.stderr
    assert "checkpoint" in run.stdout
    reports = list(out.glob("rank-*.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["account"]["steps"] == 12
    assert report["account"]["host_seconds"]["checkpoint"] > 0  # torch.save was hooked
    # Tensor.item on a CPU tensor does not wait for a GPU: not a sync stall.
    assert report["account"]["host_seconds"]["sync"] == 0
    trace = json.loads(next(out.glob("trace-*.json")).read_text())
    assert any(e["name"] == "data_wait" for e in trace["traceEvents"])


def test_stoker_doctor_says_when_no_loop_reported(stoker_bin, tmp_path):
    import subprocess
    import sys
    temp = tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0", TMPDIR=str(temp))
    run = subprocess.run([stoker_bin, "doctor", "--", sys.executable, "-c", "print('hello')"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "hello" in run.stdout
    assert "no Python process reported a training loop" in run.stderr
    # Neither the folder that attached the doctor nor an empty report folder of its own is left behind.
    assert list(temp.iterdir()) == []
    run = subprocess.run([stoker_bin, "doctor", "--", "/nonexistent/program"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 127 and "cannot run /nonexistent/program" in run.stderr
    assert "no Python process reported" not in run.stderr  # nothing ran: nothing to report on
    assert list(temp.iterdir()) == []


def test_what_if_replays_a_batch_to_check_the_input_bound_prediction():
    planted = Planted()
    doc = run_loop(planted, steps=20, data_delay=0.020, compute=0.020)
    result = doc.what_if_perfect_loader(lambda batch: time.sleep(0.020), batch=0, steps=20)
    # Half the step waited for data: without it the loop runs about twice as fast, and so does the replay.
    assert result["predicted_steps_per_s"] == pytest.approx(2 * result["measured_steps_per_s"], rel=0.15)
    assert abs(result["prediction_error"]) < 0.15, result
    assert "what if the loader were never waited for" in doc.report()
    with pytest.raises(RuntimeError, match="no steps measured"):
        Doctor(cuda=False, nvml=False).what_if_perfect_loader(lambda b: None, 0)


DISTRIBUTED_SCRIPT = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % sys.argv[1], rank=int(sys.argv[2]), world_size=2)
data = [torch.ones(4) for _ in range(10)]
for x in torch.utils.data.DataLoader(data, batch_size=2):
    if dist.get_rank() == 1:
        time.sleep(0.02)  # this rank's slow step holds the other back at the all-reduce
    dist.all_reduce(x)
dist.destroy_process_group()
"""


def test_stoker_doctor_hooks_collectives_and_compares_ranks(stoker_bin, tmp_path):
    import socket
    import subprocess
    import sys
    script = tmp_path / "dist.py"
    script.write_text(DISTRIBUTED_SCRIPT)
    launcher = tmp_path / "launch.py"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher.write_text(
        "import subprocess, sys, os\n"
        "procs = [subprocess.Popen([sys.executable, %r, %r, str(r)], env=dict(os.environ, RANK=str(r))) "
        "for r in range(2)]\n"
        "sys.exit(max(p.wait() for p in procs))\n" % (str(script), str(port)))
    out = tmp_path / "doctor"
    run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--", sys.executable, str(launcher)],
                         env=dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0"), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    reports = {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    assert set(reports) == {"0", "1"}
    # Rank 0 waited in the all-reduce (5 steps x 20 ms) for rank 1, whose own time went to its 20 ms of work.
    assert reports["0"]["account"]["host_seconds"]["communication"] > 0.05
    assert reports["1"]["account"]["seconds"]["compute"] > 0.09
    assert "=== all 2 processes (the slowest first)" in run.stdout


def test_stoker_doctor_hooks_stoker_loader(stoker_bin, cli, demo_images, tmp_path):
    import subprocess
    import sys
    packed = tmp_path / "packed"
    cli("pack", demo_images, packed)
    script = tmp_path / "train.py"
    script.write_text(
        "import time, stoker, stoker.transforms as T\n"
        "loader = stoker.Loader(%r, batch_size=8, num_threads='auto', transform=T.Compose([T.RandomResizedCrop(32)]))\n"
        "for epoch in range(2):\n"
        "    for x, y in loader:\n"
        "        time.sleep(0.001)\n" % str(packed))
    out = tmp_path / "doctor"
    run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--", sys.executable, str(script)],
                         env=dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0"), capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(next(out.glob("rank-*.json")).read_text())
    assert report["account"]["steps"] == 12  # 48 images, 6 batches an epoch, 2 epochs: stoker.Loader was hooked
    assert report["loader_seen"]  # its advice reads the loader's own stats, never "use stoker.Loader"
    assert "use stoker.Loader" not in report["report"]


def test_closing_twice_is_harmless():
    doc = run_loop(Planted(), steps=3)
    before = doc.account()
    doc.close()
    assert doc.account() == before

