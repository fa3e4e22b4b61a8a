"""What the elastic tests share: a small packed dataset, the example programs' arguments and
logs, uninterrupted reference runs, and the launcher's processes."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import SOURCE_DIR

torch = pytest.importorskip("torch")
import stoker  # noqa: E402

EXAMPLE = str(SOURCE_DIR / "examples" / "elastic_train.py")
DDP_EXAMPLE = str(SOURCE_DIR / "examples" / "elastic_ddp.py")
sys.path.insert(0, str(SOURCE_DIR / "examples"))
from elastic_train import check as check_step_log  # noqa: E402
EPOCHS = 2
GLOBAL_BATCH = 16
NUM_SAMPLES = 100  # 7 steps per epoch, the last one of 4 samples


@pytest.fixture(scope="module")
def packed(tmp_path_factory, stoker_bin):
    root = tmp_path_factory.mktemp("elastic")
    subprocess.run([sys.executable, str(SOURCE_DIR / "scripts" / "make_demo_data.py"), str(root / "img"),
                    "--classes", "4", "--per-class", str(NUM_SAMPLES // 4), "--jobs", "2"], check=True,
                   capture_output=True)
    subprocess.run([stoker_bin, "pack", str(root / "img"), str(root / "packed")], check=True, capture_output=True)
    return str(root / "packed")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [os.environ.get("PYTHONPATH"), str(SOURCE_DIR / "examples")] if p)
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has_fsdp2():
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    except Exception:  # noqa: BLE001 - torch 1.13's fsdp package fails to import on Python 3.11 (ValueError)
        return False
    return True


needs_fsdp2 = pytest.mark.skipif(not _has_fsdp2(), reason="FSDP2 (fully_shard) needs torch >= 2.6; this is %s"
                                 % torch.__version__)


def _example_args(packed, tmp, name, delay, extra=()):
    return [EXAMPLE, "--data", packed, "--epochs", str(EPOCHS), "--global-batch", str(GLOBAL_BATCH),
            "--log", str(tmp / (name + ".jsonl")), "--save-params", str(tmp / (name + ".pt")),
            "--summary", str(tmp / (name + "_summary.jsonl")), "--step-delay", str(delay), "--timeout", "5",
            *extra]


def _lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


def _wait_for_steps(path, n, proc, timeout=90, world_size=None):
    """Until `path` logs `n` step lines (those of steps at `world_size` only, when given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len([r for r in _lines(path) if world_size is None or r.get("world_size") == world_size]) >= n:
            return
        if proc.poll() is not None:
            pytest.fail("the run ended (%s) before step %d:\n%s" % (proc.returncode, n, proc.output()[-4000:]))
        time.sleep(0.05)
    pytest.fail("step %d not logged within %d s" % (n, timeout))


def _workers(launcher, at_least=1):
    """The launcher's training workers (at least `at_least` of them, else the test fails with its output)."""
    launcher_pid = launcher.pid
    out = subprocess.run(["pgrep", "-P", str(launcher_pid)], capture_output=True, text=True).stdout.split()
    pids = []
    for pid in out:
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                if b"elastic_train.py" in f.read():
                    pids.append(int(pid))
        except FileNotFoundError:
            pass
    if len(pids) < at_least:
        os.killpg(launcher.pid, signal.SIGKILL)
        pytest.fail("%d workers running, expected at least %d:\n%s" % (len(pids), at_least,
                                                                       launcher.output()[-4000:]))
    return sorted(pids)


class Drained(subprocess.Popen):
    """A run whose output is read as it comes: a pipe nobody reads blocks its
    writer once it holds 64 KB (torch 2.x's C++ stack traces fill one fast),
    so a test waiting on one run must not leave another's pipe unread."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._chunks = []
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        for line in self.stdout:
            self._chunks.append(line)

    def output(self):
        return "".join(self._chunks)

    def communicate(self, input=None, timeout=None):
        """Waits for the process and the end of its output (which a child
        that outlives it, holding the pipe, delays)."""
        start = time.monotonic()
        self.wait(timeout)
        self._reader.join(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))
        if self._reader.is_alive():
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.output(), None


def _finish(proc, timeout=120):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail("the run did not finish within %d s:\n%s" % (timeout, out[-4000:]))
    return out


def _check_log(tmp, name):
    problems = check_step_log(str(tmp / (name + ".jsonl")), NUM_SAMPLES, EPOCHS, GLOBAL_BATCH)
    assert not problems, problems
    return _lines(tmp / (name + ".jsonl"))


def _assert_params_match(reference, path, tol=1e-5):
    got = torch.load(path)
    for k, v in reference.items():
        diff = (got[k] - v).abs().max().item()
        assert diff <= tol, "%s differs by %g from the uninterrupted run" % (k, diff)


def _summaries(tmp, name):
    return _lines(tmp / (name + "_summary.jsonl"))


@pytest.fixture(scope="module")
def reference(packed, tmp_path_factory):
    """One uninterrupted process: the parameters every elastic run must reach."""
    tmp = tmp_path_factory.mktemp("reference")
    subprocess.run([sys.executable] + _example_args(packed, tmp, "ref", 0), check=True, env=_env(),
                   capture_output=True)
    lines = _check_log(tmp, "ref")
    assert {r["world_size"] for r in lines} == {1}
    return torch.load(tmp / "ref.pt")


def _launch(args, env=None, **kw):
    return Drained([sys.executable, "-m", "stoker.elastic.launch", *args], env=env or _env(), text=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, **kw)



def _ddp_args(packed, tmp, name, delay):
    return [DDP_EXAMPLE, "--data", packed, "--epochs", str(EPOCHS), "--global-batch", str(GLOBAL_BATCH),
            "--log", str(tmp / (name + ".jsonl")), "--save-params", str(tmp / (name + ".pt")),
            "--step-delay", str(delay), "--timeout", "5"]


def _ddp_check(packed, tmp, name):
    r = subprocess.run([sys.executable, DDP_EXAMPLE, "--check", str(tmp / (name + ".jsonl")), "--data", packed,
                        "--epochs", str(EPOCHS)], env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return [json.loads(line) for line in open(tmp / (name + ".jsonl"))]


@pytest.fixture(scope="module")
def ddp_reference(packed, tmp_path_factory):
    """The same DDP loop as one plain process: the parameters every elastic run must reach."""
    tmp = tmp_path_factory.mktemp("ddp-reference")
    subprocess.run([sys.executable] + _ddp_args(packed, tmp, "ref", 0), check=True, env=_env(),
                   capture_output=True)
    lines = _ddp_check(packed, tmp, "ref")
    assert {r["world_size"] for r in lines} == {1}
    return torch.load(tmp / "ref.pt")


def _ddp_workers(launcher, at_least):
    out = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
    pids = sorted(int(p) for p in out if b"elastic_ddp.py" in open("/proc/%s/cmdline" % p, "rb").read())
    assert len(pids) >= at_least, pids
    return pids


def _tiny_loader(packed, batch):
    import stoker.transforms as T
    return stoker.Loader(packed, global_batch_size=batch, with_indices=True, log_epochs=False, num_threads=1,
                         transform=T.Compose([T.Resize(8), T.CenterCrop(8)]))


def _wait_for_join_request(port, joiner, timeout=120):
    """Until the in-process rendezvous at `port` has a join request (the joiner reached it)."""
    import datetime
    import torch.distributed
    store = torch.distributed.TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=30))
    deadline = time.monotonic() + timeout
    while int(store.add("joins", 0)) < 1:
        assert joiner.poll() is None and time.monotonic() < deadline, "the joiner never asked to join"
        time.sleep(0.1)
