"""The doctor inside real loops: it never raises into them for trouble of its
own (a port taken, a GPU timer that fails, another thread closing it), it
counts what a training step is (optimizer steps, not evaluation batches or
warm-up), and it reads the process's own GPU from NVML."""
import os
import socket
import threading

import pytest

from conftest import fake_nvml_library
from stoker.doctor import Doctor, _auto
from stoker.doctor.testing import FakeClock, FakeGpuQueue


def test_a_taken_port_is_passed_over_with_a_warning_never_raised(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        doc = Doctor(cuda=False, nvml=False)
        bound = doc.serve(port)
        assert bound is not None and bound != port
        assert "port %d is in use; serving metrics on %d" % (port, bound) in capsys.readouterr().err
        doc.close()
        alone = Doctor(cuda=False, nvml=False, warmup_steps=0)
        assert alone.serve(port, tries=1) is None  # nothing free to try: a warning, no endpoint, no exception
        assert "not serving metrics: ports %d to %d on 127.0.0.1 are in use" % (port, port) in capsys.readouterr().err
        for _ in alone.batches(range(3)):
            pass
        alone.close()
        assert alone.account()["steps"] == 3


class BrokenGpu(FakeGpuQueue):
    """A GPU timer that fails after a few events, as a CUDA context that went bad would."""

    def __init__(self, clock, fail_after):
        super().__init__(clock)
        self.left = fail_after

    def record(self):
        self.left -= 1
        if self.left < 0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return super().record()


def test_the_doctors_own_failure_is_said_once_and_the_loop_goes_on(capsys):
    clock = FakeClock()
    doc = Doctor(clock=clock, gpu=BrokenGpu(clock, fail_after=6), nvml=False, warmup_steps=0)
    seen = []
    for batch in doc.batches(range(10)):
        with doc.phase("sync"):
            clock.advance(0.001)
        seen.append(batch)
    doc.close()
    assert seen == list(range(10))  # every batch reached the loop, once
    err = capsys.readouterr().err
    assert err.count("stoker doctor: stopped accounting after an error of its own") == 1
    assert "illegal memory access" in err
    assert any("stopped after an error of its own" in w for w in doc.cannot_see)
    assert "could not see: the rest of the run" in doc.report()


def test_exceptions_from_the_loader_pass_through_unchanged():
    doc = Doctor(cuda=False, nvml=False)

    def failing():
        yield 1
        raise KeyError("sample 7 is corrupt")
    with pytest.raises(KeyError, match="sample 7"):
        for _ in doc.batches(failing()):
            pass
    doc.close()


def test_threads_hammering_the_doctor_while_the_loop_runs_break_nothing():
    # The loop's thread opens steps and phases while other threads open phases (a background checkpoint
    # writer calling torch.save), read every output and finally close it: nothing raises, phases from
    # other threads count nothing, and the account still adds up.
    doc = Doctor(cuda=False, nvml=False, warmup_steps=0, trace_steps=16)
    errors, stop = [], threading.Event()

    def other(kind):
        try:
            while not stop.is_set():
                if kind == "phase":
                    with doc.phase("checkpoint"):
                        pass
                    doc.optimizer_step()
                else:
                    doc.account(), doc.prometheus_text(), doc.chrome_trace(), doc.report()
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=other, args=(k,)) for k in ("phase", "phase", "read", "read")]
    for t in threads:
        t.start()
    halfway = threading.Event()
    closer = threading.Thread(target=lambda: (halfway.wait(), doc.close()))
    closer.start()
    batches = 0
    for _ in doc.batches(range(600)):  # the loop goes on after another thread closed the doctor
        batches += 1
        with doc.phase("sync"):
            pass
        if batches == 300:
            halfway.set()
    stop.set()
    for t in threads + [closer]:
        t.join()
    assert not errors, errors
    a = doc.account()
    assert batches == 600
    assert 299 <= a["steps"] <= 600  # every step before the close counted, however fast the machine
    assert a["host_seconds"]["checkpoint"] == 0.0  # other threads' phases counted nothing
    assert sum(a["seconds"].values()) == pytest.approx(a["wall_s"], rel=1e-9)


def test_optimizer_steps_evaluation_and_warmup_are_told_apart():
    import torch
    clock = FakeClock()
    doc = Doctor(cuda=False, nvml=False, clock=clock, warmup_steps=2)

    def data(n, wait):
        for i in range(n):
            clock.advance(wait)
            yield i
    for epoch in range(2):
        for i, _ in enumerate(doc.batches(data(8, 0.010))):
            clock.advance(0.020)  # forward and backward of a micro-batch
            if i % 2 == 1:  # accumulation over 2 micro-batches
                doc.optimizer_step()
        with torch.no_grad():  # evaluation: timed, never a training step
            for _ in doc.batches(data(3, 0.100)):
                clock.advance(0.050)
    doc.close()
    a = doc.account()
    # Until the first optimizer step the doctor cannot know a step holds two micro-batches: the first
    # two steps are one batch each (and are the warm-up). Then 2 + 4 optimizer steps of two
    # micro-batches, each 10 ms waiting and 20 ms computing.
    assert a["warmup"]["steps"] == 2
    assert a["steps"] == 7
    assert a["micro_batches"] == 14
    assert a["evaluation"]["batches"] == 6
    assert a["evaluation"]["wall_s"] == pytest.approx(2 * 3 * 0.150, abs=1e-9)
    # Counted: 7 steps of 60 ms (the loaders' end-of-data waits take no time here).
    assert a["wall_s"] == pytest.approx(7 * 0.060, abs=1e-9)
    assert a["seconds"]["data_wait"] == pytest.approx(7 * 0.020, abs=1e-9)
    report = doc.report()
    assert "14 batches in 7 steps (gradient accumulation)" in report
    assert "the first 2 steps as warm-up" in report and "6 evaluation batches" in report


@pytest.mark.parametrize("visible,expected", [("1", 70.0), ("1,0", 70.0), ("0", 10.0), (None, 10.0)])
def test_nvml_reads_the_processs_own_device(tmp_path, monkeypatch, visible, expected):
    monkeypatch.setenv("STOKER_NVML_LIBRARY", fake_nvml_library())
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "fake-gpu"))
    monkeypatch.setenv("FAKE_GPU_DEVICES", "2")
    monkeypatch.setenv("FAKE_GPU_UTILIZATION", "10,70")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    from stoker.doctor import _gpu
    sampler = _gpu.NvmlSampler(_gpu.Nvml(_gpu.visible_device(0)), interval=0.02)
    import time
    time.sleep(0.15)
    sampler.stop()
    assert sampler.mean_utilization() == pytest.approx(expected)
    assert sampler.window_utilization() == pytest.approx(expected)


def test_nvml_finds_a_device_by_uuid_prefix(tmp_path, monkeypatch):
    monkeypatch.setenv("STOKER_NVML_LIBRARY", fake_nvml_library())
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "fake-gpu"))
    monkeypatch.setenv("FAKE_GPU_UTILIZATION", "10,70")
    import ctypes
    from stoker.doctor import _gpu
    lib = ctypes.CDLL(fake_nvml_library())
    assert lib.nvmlInit_v2() == 0
    handle, text = ctypes.c_void_p(), ctypes.create_string_buffer(96)
    assert lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(1), ctypes.byref(handle)) == 0
    assert lib.nvmlDeviceGetUUID(handle, text, ctypes.c_uint(96)) == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", text.value.decode()[:12])  # CUDA accepts a unique prefix
    assert _gpu.Nvml(_gpu.visible_device(0)).utilization() == 70
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-ffffffff")
    with pytest.raises(OSError, match="no NVML device has the UUID GPU-ffffffff"):
        _gpu.Nvml(_gpu.visible_device(0))


class FakeCudaTensor:
    is_cuda = True

    def item(self):
        return 1.0


def test_host_sync_hooks_count_only_gpu_tensors(monkeypatch):
    clock = FakeClock()
    doc = Doctor(cuda=False, nvml=False, clock=clock, warmup_steps=0)
    monkeypatch.setattr(_auto, "_doctor", doc)

    class CpuTensor(FakeCudaTensor):
        is_cuda = False
    for cls in (FakeCudaTensor, CpuTensor):
        _auto._patch(cls, "item", "sync", when=_auto._on_cuda)
    slow = FakeCudaTensor.item.__wrapped__

    def waiting_item(self):
        clock.advance(0.004 if self.is_cuda else 0.001)
        return slow(self)
    FakeCudaTensor.item = _auto._in_phase("sync", waiting_item, _auto._on_cuda)
    CpuTensor.item = _auto._in_phase("sync", waiting_item, _auto._on_cuda)
    for _ in doc.batches(range(5)):
        FakeCudaTensor().item()
        CpuTensor().item()
    doc.close()
    a = doc.account()
    assert a["host_seconds"]["sync"] == pytest.approx(5 * 0.004)
    assert a["seconds"]["compute"] == pytest.approx(5 * 0.001)


DDP_SCRIPT = """
import hashlib, os, sys, time, torch, torch.distributed as dist
port, rank, world, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)), bucket_cap_mb=1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = [(torch.randn(16, 64, generator=torch.Generator().manual_seed(rank * 1000 + i)), i % 10) for i in range(12)]
for x, y in torch.utils.data.DataLoader(data, batch_size=None):
    loss = torch.nn.functional.cross_entropy(model(x), torch.full((16,), y))
    if rank == 1 and os.environ.get("SLOW"):
        time.sleep(0.03)  # this rank's slow backward holds the others in DDP's all-reduce
    loss.backward()
    opt.step()
    opt.zero_grad()
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
with open("%s.%d" % (out, rank), "w") as f:
    f.write(digest)
dist.destroy_process_group()
"""


def run_ddp(stoker_bin, tmp_path, name, world, doctor, slow):
    import subprocess
    import sys
    script = tmp_path / "ddp.py"
    script.write_text(DDP_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import subprocess, sys, os\n"
        "procs = [subprocess.Popen([sys.executable, %r, %r, str(r), %r, %r], env=dict(os.environ, RANK=str(r))) "
        "for r in range(%d)]\n"
        "sys.exit(max(p.wait() for p in procs))\n" % (str(script), str(port), str(world), str(tmp_path / name), world))
    out = tmp_path / ("doctor-" + name)
    env = dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="2")
    if slow:
        env["SLOW"] = "1"
    command = [sys.executable, str(launcher)]
    if doctor:
        command = [stoker_bin, "doctor", "--out", str(out), "--"] + command
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    digests = {(tmp_path / ("%s.%d" % (name, r))).read_text() for r in range(world)}
    assert len(digests) == 1  # the replicas agree
    import json
    reports = {json.loads(p.read_text())["rank"]: json.loads(p.read_text()) for p in out.glob("rank-*.json")}
    return digests.pop(), reports, run


def test_ddp_all_reduce_waits_are_communication_and_the_gradients_keep_their_bits(stoker_bin, tmp_path):
    # Three ranks (1/3 is not a power of two: a divide instead of DDP's multiply would change bits).
    plain, _, _ = run_ddp(stoker_bin, tmp_path, "plain", 3, doctor=False, slow=False)
    examined, _, _ = run_ddp(stoker_bin, tmp_path, "examined", 3, doctor=True, slow=False)
    assert examined == plain
    _, reports, run = run_ddp(stoker_bin, tmp_path, "slow", 2, doctor=True, slow=True)
    # Rank 0 waits in DDP's all-reduce for rank 1's 30 ms each step (10 counted steps).
    waited = reports["0"]["account"]["seconds"]["communication"]
    assert 0.15 < waited < 1.0, reports["0"]["report"]  # 0.3 s planted; the rest is a loaded machine
    assert reports["0"]["verdict"][0]["finding"].startswith("exposed communication"), reports["0"]["report"]
    assert reports["1"]["account"]["seconds"]["communication"] < waited / 2
    assert reports["0"]["account"]["steps"] == 10


def test_stoker_doctor_finds_its_package_and_python_beside_the_binary(stoker_bin, tmp_path):
    import subprocess
    import sys
    # A python3 first on PATH that is not the one stoker was built for, and no PYTHONPATH.
    decoy = tmp_path / "bin"
    decoy.mkdir()
    (decoy / "python3").write_text("#!/bin/sh\necho 'the wrong python3' >&2\nexit 99\n")
    (decoy / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "STOKER_PYTHON")}
    env["PATH"] = "%s:%s" % (decoy, env.get("PATH", "/usr/bin:/bin"))
    run = subprocess.run([stoker_bin, "doctor", "--", sys.executable, "-c", "print('ran')"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "ran" in run.stdout, run.stdout + run.stderr
    # A Python that cannot import the package: one line saying so and how to fix it, no traceback.
    isolated = tmp_path / "isolated-python"
    isolated.write_text("#!/bin/sh\nexec %s -E -s \"$@\"\n" % sys.executable)
    isolated.chmod(0o755)
    env = dict(env, STOKER_PYTHON=str(isolated), PYTHONNOUSERSITE="1")
    run = subprocess.run([stoker_bin, "doctor", "--", "true"], env=env, capture_output=True, text=True, timeout=120)
    if run.returncode == 0:
        pytest.skip("this Python imports stoker from its own site-packages")
    assert run.returncode == 2, run.stderr
    assert "cannot import stoker's Python package" in run.stderr and "STOKER_PYTHON" in run.stderr
    assert "Traceback" not in run.stderr


def test_stoker_doctor_keeps_the_loop_running_when_its_port_is_taken(stoker_bin, tmp_path):
    import json
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text("import torch\nfor x in torch.utils.data.DataLoader(list(range(20)), batch_size=2):\n    pass\n")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = tmp_path / "doctor"
        env = dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0", LOCAL_RANK="0")
        run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--prometheus-port", str(port), "--",
                              sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "port %d is in use; serving metrics on" % port in run.stderr
    report = json.loads(next(out.glob("rank-*.json")).read_text())
    assert report["account"]["steps"] == 10


def test_stoker_doctor_counts_optimizer_steps_and_evaluation_through_its_hooks(stoker_bin, tmp_path):
    import json
    import subprocess
    import sys
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(4, 2)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "data = [(torch.randn(8, 4), torch.randint(0, 2, (8,))) for _ in range(12)]\n"
        "for i, (x, y) in enumerate(torch.utils.data.DataLoader(data, batch_size=None)):\n"
        "    torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "    if i % 2 == 1:  # gradient accumulation over 2 micro-batches\n"
        "        opt.step(); opt.zero_grad()\n"
        "with torch.no_grad():\n"
        "    for x, y in torch.utils.data.DataLoader(data[:5], batch_size=None):\n"
        "        model(x)\n")
    out = tmp_path / "doctor"
    run = subprocess.run([stoker_bin, "doctor", "--out", str(out), "--", sys.executable, str(script)],
                         env=dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="0"),
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    account = json.loads(next(out.glob("rank-*.json")).read_text())["account"]
    # The first optimizer step comes at the second batch: until then each batch is a step of its own.
    assert account["steps"] == 7 and account["micro_batches"] == 12, account
    assert account["evaluation"]["batches"] == 5


def test_a_program_the_doctor_cannot_attach_to_runs_and_is_named(stoker_bin, tmp_path):
    # The program's Python cannot import stoker's package (here a broken numpy shadows the real one): the
    # program runs as it is, and the one line says which process and which Python, so that a job with
    # several Pythons (a launcher's, the workers') shows which one lacks what.
    import subprocess
    import sys
    shadow = tmp_path / "shadow" / "numpy"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('this numpy is broken')\n")
    child = "PYTHONPATH=%s:$PYTHONPATH exec %s -c \"print('ran')\"" % (tmp_path / "shadow", sys.executable)
    run = subprocess.run([stoker_bin, "doctor", "--", "sh", "-c", child], capture_output=True, text=True,
                         timeout=120)
    assert "ran" in run.stdout, run.stdout + run.stderr
    assert "stoker doctor: not attached to process " in run.stderr, run.stderr
    assert "(%s): this numpy is broken" % sys.executable in run.stderr, run.stderr
