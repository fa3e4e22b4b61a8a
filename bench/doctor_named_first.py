"""Does the doctor name the planted cause first? Real CPU training loops run
unchanged under `stoker doctor` (the hooks, not the API), 10 runs per
cause, each with one cause planted at about a third of the step beside a
smaller data wait:

- data wait: a DataLoader whose __getitem__ sleeps;
- checkpoint: torch.save of the model, optimizer and a 48 MB extra state
  every 4 steps, fsynced;
- collective: DDP on gloo, 2 ranks, rank 1's backward 40 ms slower; the
  waiting rank 0 is judged;
- host sync: needs a GPU (the hooks count .item()/.cpu() on CUDA tensors
  only); on this machine it is planted on the fake GPU queue through the
  API (exact clocks), on the GPU machine by scripts/gpu-check's doctor part.

Also the doctor's end-to-end cost: the same compute-bound loop with and
without `stoker doctor`, alternated, steps/s medians.

    STOKER_BIN=build/release/stoker PYTHONPATH=build/release/python \
        .venv/bin/python bench/doctor_named_first.py [--runs 10]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

LOOP = r"""
import os, sys, time, torch
torch.set_num_threads(1)
cause, out = sys.argv[1], sys.argv[2]
class Data(torch.utils.data.Dataset):
    def __len__(self): return 40 * 8
    def __getitem__(self, i):
        time.sleep(0.0025 if cause == "data_wait" else 0.0003)  # 20 ms a batch planted, else 2.4 ms
        return torch.randn(256), i % 10
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024),
                            torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.Adam(model.parameters())
ema = torch.zeros(12_000_000)  # a model-sized extra state (48 MB) the checkpoint carries
for step, (x, y) in enumerate(torch.utils.data.DataLoader(Data(), batch_size=8)):
    if step == 5:
        steady = time.perf_counter()  # steps/s from here on, past the warm-up
    t = time.perf_counter()
    while time.perf_counter() - t < 0.030:  # 30 ms of compute a step
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
    opt.step(); opt.zero_grad()
    if cause == "checkpoint" and step % 4 == 3:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "ema": ema}, out)
        os.fsync(os.open(out, os.O_RDONLY))
if cause == "none":
    print((step - 5) / (time.perf_counter() - steady))
"""

DDP = r"""
import os, sys, time, torch, torch.distributed as dist
torch.set_num_threads(1)
port, rank = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%s" % port, rank=rank, world_size=2)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                                                                      torch.nn.Linear(512, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
data = [(torch.randn(8, 256), torch.randint(0, 10, (8,))) for _ in range(40)]
for x, y in torch.utils.data.DataLoader(data, batch_size=None):
    time.sleep(0.002)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    time.sleep(0.030 + (0.040 if rank == 1 else 0.0))  # the forward's cost; rank 1 is the straggler
    loss.backward()
    opt.step(); opt.zero_grad()
dist.destroy_process_group()
"""

NAMES = {"data_wait": "input-bound", "checkpoint": "checkpoint stalls", "communication": "exposed communication",
         "sync": "host synchronisation"}


def stoker_doctor(command, out, env_extra=None):
    env = dict(os.environ, STOKER_PYTHON=sys.executable, STOKER_DOCTOR_WARMUP="3", **(env_extra or {}))
    run = subprocess.run([os.environ.get("STOKER_BIN", "build/release/stoker"), "doctor", "--out", out, "--"] +
                         command, env=env, capture_output=True, text=True, timeout=600)
    if run.returncode != 0:
        raise SystemExit("run failed: %s\n%s" % (command, run.stderr))
    reports = {}
    for name in os.listdir(out):
        if name.startswith("rank-"):
            with open(os.path.join(out, name)) as f:
                r = json.load(f)
            reports[r["rank"]] = r
    return reports


def first_finding(report):
    return report["verdict"][0]["finding"] if report["verdict"] else "compute-bound"


def planted_run(cause, tmp):
    out = tempfile.mkdtemp(dir=tmp)
    if cause == "communication":
        script = os.path.join(tmp, "ddp.py")
        with open(script, "w") as f:
            f.write(DDP)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        launcher = os.path.join(tmp, "launch.py")
        with open(launcher, "w") as f:
            f.write("import subprocess, sys, os\nprocs = [subprocess.Popen([sys.executable, %r, %r, str(r)], "
                    "env=dict(os.environ, RANK=str(r))) for r in range(2)]\nsys.exit(max(p.wait() for p in procs))\n"
                    % (script, str(port)))
        report = stoker_doctor([sys.executable, launcher], out)["0"]
    else:
        script = os.path.join(tmp, "loop.py")
        with open(script, "w") as f:
            f.write(LOOP)
        report = next(iter(stoker_doctor([sys.executable, script, cause, os.path.join(tmp, "ckpt.pt")],
                                         out).values()))
    return first_finding(report), report["account"]["share"]


def sync_on_fake_queue():
    from stoker.doctor import Doctor
    from stoker.doctor.testing import FakeClock, FakeGpuQueue
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = Doctor(clock=clock, gpu=queue, nvml=False, warmup_steps=3)

    def data():
        for _ in range(40):
            clock.advance(0.002)
            yield 0
    for _ in doc.batches(data()):
        for _ in range(10):
            queue.launch(0.002)
        with doc.phase("sync"):  # .item() on the loss: waits for the queue
            queue.synchronize()
        clock.advance(0.010)  # the host's own work after the sync, the GPU idle
    doc.close()
    a = doc.account()
    # The GPU computed while the host waited: the cost is the host's wait (the verdict's measure).
    return first_finding({"verdict": [{"finding": f} for f, _, _ in doc.verdict()]}), {
        "sync": a["host_seconds"]["sync"] / a["wall_s"]}


def overhead(tmp, runs):
    script = os.path.join(tmp, "loop.py")
    with open(script, "w") as f:
        f.write(LOOP)
    plain, examined = [], []
    for _ in range(runs):
        for doctor in (False, True):
            command = [sys.executable, script, "none", os.path.join(tmp, "x")]
            if doctor:
                command = [os.environ.get("STOKER_BIN", "build/release/stoker"), "doctor", "--out",
                           tempfile.mkdtemp(dir=tmp), "--"] + command
            run = subprocess.run(command, env=dict(os.environ, STOKER_PYTHON=sys.executable), capture_output=True,
                                 text=True, timeout=600)
            rate = float(run.stdout.strip().splitlines()[0])
            (examined if doctor else plain).append(rate)
    return statistics.median(plain), statistics.median(examined), plain, examined


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--causes", default="data_wait,checkpoint,communication,sync")
    parser.add_argument("--no-overhead", action="store_true")
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="doctor-named-first-")
    results = {}
    for cause in args.causes.split(","):
        firsts, shares = [], []
        for _ in range(args.runs):
            first, share = sync_on_fake_queue() if cause == "sync" else planted_run(cause, tmp)
            firsts.append(first)
            shares.append(share[cause])
        named = sum(f.startswith(NAMES[cause]) for f in firsts)
        results[cause] = {"named_first": named, "runs": args.runs, "median_share": statistics.median(shares),
                          "other_firsts": sorted({f for f in firsts if not f.startswith(NAMES[cause])})}
        print("%-14s named first in %2d of %d runs (median share %.0f%%)%s" % (
            cause, named, args.runs, 100 * results[cause]["median_share"],
            "; otherwise: " + "; ".join(results[cause]["other_firsts"]) if results[cause]["other_firsts"] else ""))
    if args.no_overhead:
        print(json.dumps(results))
        return
    plain, examined, p, e = overhead(tmp, max(3, args.runs // 2))
    results["overhead"] = {"plain_steps_per_s": plain, "doctor_steps_per_s": examined,
                           "cost": 1 - examined / plain, "plain_runs": p, "doctor_runs": e}
    print("end-to-end: %.2f steps/s plain, %.2f under stoker doctor (%+.2f%%; runs %s vs %s)" % (
        plain, examined, -100 * results["overhead"]["cost"], ["%.2f" % x for x in p], ["%.2f" % x for x in e]))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
