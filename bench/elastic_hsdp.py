#!/usr/bin/env python3
"""A model sharded within replica groups (FSDP2), fault tolerant across them:
what a group's failure costs and what the elasticity costs per step.

    PYTHONPATH=build/release/python python bench/elastic_hsdp.py [--repeats 3] [--json OUT]

needs torch >= 2.6 (FSDP2 on gloo; /tmp/t27 here, the GPU machine's
python3). 4 workers in 2 replica groups of 2, the CNN of
examples/elastic_train.py --shard, on the CPU (gloo):

- **recovery**: a worker of the second group SIGKILLed at step 4: seconds
  from the kill to the first group's next committed step, and to the
  restarted group's first step in the job; samples lost or repeated
  (the step log); the final parameters against one unsharded process's.
- **overhead**: seconds a step, from step 5 on, of stoker.elastic.run() over
  the sharded model against the same model and loader under torch's own
  HSDP (fully_shard over a 2-D mesh: replicate x shard, no elasticity),
  with --extra seconds of sleep a step standing for a GPU's compute (the
  CPU then free, as on a GPU machine).
- **trainer**: the same against torch's HSDP for stoker.elastic.Trainer's
  loop (examples/elastic_ddp.py --shard: 2 micro-batches, clipping, StepLR;
  the same loop under HSDP); with --amp both loops use torch's GradScaler.
- **checkpoint** (run(checkpointer=dict(...)), written by the oldest
  group, each worker its shards): a step's time with a checkpoint every
  --every steps against none, same runs otherwise; and every group failing
  at once (a worker of each SIGKILLed at step 6): seconds from the kill to
  the restarted groups restoring the newest checkpoint, the steps trained
  again, samples and final parameters as for recovery.
"""
import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_train.py")
sys.path.insert(0, os.path.join(ROOT, "examples"))

NATIVE = r"""
import os, sys, time, json, torch, stoker, stoker.transforms as T
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
data, extra, out, batch = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
loop = sys.argv[5] if len(sys.argv) > 5 else "run"  # "trainer": examples/elastic_ddp.py's loop
amp = len(sys.argv) > 6 and sys.argv[6] == "amp"  # the trainer loop with torch's GradScaler (on the CPU: float32)
scaler = torch.amp.GradScaler("cpu") if amp else None
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                      nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10))
mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
for layer in model:
    if any(True for _ in layer.parameters()):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
transform = T.Compose([T.RandomResizedCrop(16), T.RandomHorizontalFlip(), T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
if loop == "trainer":
    transform = T.Compose([T.Resize(16), T.CenterCrop(16)])
loader = stoker.Loader(data, global_batch_size=batch, transform=transform, with_indices=True, num_threads=1,
                       log_epochs=False, min_world_size=world)
loader.reshard(rank, world)
times, cpu, last, last_cpu = [], [], None, None
for images, labels, _ in loader:
    if loop == "trainer":  # 2 micro-batches (reduced on the last), clipping, a scheduler: as elastic_ddp.py
        half = len(labels) // 2
        for i, (a, b) in enumerate(((0, half), (half, len(labels)))):
            model.set_requires_gradient_sync(i == 1)
            loss = nn.functional.cross_entropy(model(images[a:b]), labels[a:b] % 10) * ((b - a) * world / batch)
            (scaler.scale(loss) if scaler else loss).backward()
        if extra:
            time.sleep(extra)
        if scaler:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler:
            scaler.step(opt); scaler.update()
        else:
            opt.step()
        sched.step(); opt.zero_grad()
    else:
        if extra:
            time.sleep(extra)
        # The mean over the global batch: FSDP averages over the world, so each rank's loss is its share's sum x
        # world / B.
        loss = nn.functional.cross_entropy(model(images), labels % 10, reduction="sum") * world / batch
        loss.backward()
        opt.step(); opt.zero_grad()
    now, now_cpu = time.monotonic(), time.process_time()
    if last is not None:
        times.append(now - last)
        cpu.append(now_cpu - last_cpu)
    last, last_cpu = now, now_cpu
if rank == 0:
    with open(out, "w") as f:
        json.dump({"times": times, "cpu": cpu}, f)
dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), os.path.join(ROOT, "examples")] if p)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "STOKER_ELASTIC_REPLICA_GROUP"):
        env.pop(k, None)
    return env


def _lines(path):
    try:
        with open(path) as f:
            return [json.loads(line) for line in f]
    except FileNotFoundError:
        return []


def _example(data, tmp, name, batch, delay, epochs):
    return [EXAMPLE, "--data", data, "--epochs", str(epochs), "--global-batch", str(batch), "--log",
            os.path.join(tmp, name + ".jsonl"), "--save-params", os.path.join(tmp, name + ".pt"), "--summary",
            os.path.join(tmp, name + "_summary.jsonl"), "--step-delay", str(delay), "--timeout", "5"]


def _launch(args, log_path):
    out = open(log_path, "w")
    return subprocess.Popen([sys.executable, "-m", "stoker.elastic.launch", "--in-process", "--rdzv-endpoint",
                             "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "4", "--replica-group-size", "2",
                             "--min-workers", "2", "--max-workers", "4", *args], env=_env(), stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _stamp(line):
    m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if not m:
        return None
    return time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000.0


def _reference(data, tmp, batch, epochs):
    """The final parameters of one unsharded process (made once)."""
    import torch
    path = os.path.join(tmp, "ref.pt")
    if not os.path.exists(path):
        subprocess.run([sys.executable] + _example(data, tmp, "ref", batch, 0, epochs), check=True, env=_env(),
                       capture_output=True)
    return torch.load(path)


def _param_diff(reference, path):
    import torch
    got = torch.load(path)
    return max((got[k] - v).abs().max().item() for k, v in reference.items())


def _wait_logged(path, steps, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while len(_lines(path)) < steps and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)


def _workers(proc):
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    return sorted(int(p) for p in children)


def recovery(data, num_samples, tmp, repeats, delay):
    from elastic_train import check
    batch, epochs = 16, 2
    reference = _reference(data, tmp, batch, epochs)
    runs = []
    for i in range(repeats):
        name = "kill%d" % i
        log_path = os.path.join(tmp, name + ".log")
        proc = _launch(_example(data, tmp, name, batch, delay, epochs) + ["--shard"], log_path)
        steps = os.path.join(tmp, name + ".jsonl")
        _wait_logged(steps, 4, proc)
        victim = _workers(proc)[-1]
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=300)
        text = open(log_path).read()
        problems = check(steps, num_samples, epochs, batch) if proc.returncode == 0 else ["exit %d" % proc.returncode]
        diff = _param_diff(reference, os.path.join(tmp, name + ".pt")) if proc.returncode == 0 else None
        goes_on = [_stamp(l) for l in text.splitlines() if "training goes on at step" in l and "with 2 workers" in l]
        rejoined = [_stamp(l) for l in text.splitlines() if "training goes on at step" in l and "with 4 workers" in l]
        sizes = [r["world_size"] for r in _lines(steps)]
        runs.append({"exit": proc.returncode, "problems": problems, "max_param_diff": diff,
                     "to_survivors_going_on_s": round(min(goes_on) - killed, 3) if goes_on else None,
                     "to_group_back_s": round(min(rejoined) - killed, 3) if rejoined else None,
                     "world_sizes": sizes})
        print(json.dumps(runs[-1]), flush=True)
    return runs


def _native_hsdp(data, tmp, name, extra, batch, loop, amp=False):
    """Rank 0's step times (and CPU times) of the loop under torch's own HSDP, 4 ranks."""
    script = os.path.join(tmp, "native.py")
    with open(script, "w") as f:
        f.write(NATIVE)
    out = os.path.join(tmp, name + ".json")
    env = dict(_env(), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), WORLD_SIZE="4")
    procs = [subprocess.Popen([sys.executable, script, data, str(extra), out, str(batch), loop] + (["amp"] if amp else []),
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for r in range(4)]
    for p in procs:
        p.wait(timeout=900)
    with open(out) as f:
        return json.load(f)


def trainer(data, tmp, repeats, extra, batch, epochs, amp=False):
    """The Trainer (examples/elastic_ddp.py --shard: 2 micro-batches, clipping, StepLR; ``amp``: with torch's
    GradScaler) against the same loop under torch's HSDP: rank 0's median step from step 5."""
    results = {"stoker_trainer_sharded": [], "torch_hsdp": []}
    for i in range(repeats):
        name = "trainer%d" % i
        args = [os.path.join(ROOT, "examples", "elastic_ddp.py"), "--data", data, "--epochs", str(epochs),
                "--global-batch", str(batch), "--log", os.path.join(tmp, name + ".jsonl"), "--step-delay",
                str(extra), "--timeout", "5", "--shard"] + (["--amp"] if amp else [])
        proc = _launch(args, os.path.join(tmp, name + ".log"))
        proc.wait(timeout=900)
        lines = [r for r in _lines(os.path.join(tmp, name + ".jsonl")) if r["rank"] == 0]
        results["stoker_trainer_sharded"].append(statistics.median(_gaps([r["t"] for r in lines])[4:]))
        native = _native_hsdp(data, tmp, "native_trainer%d" % i, extra, batch, "trainer", amp)
        results["torch_hsdp"].append(statistics.median(native["times"][4:]))
        print(json.dumps({k: round(v[-1] * 1000, 2) for k, v in results.items()}), flush=True)
    return results


def overhead(data, tmp, repeats, extra, batch, epochs):
    results = {"stoker_sharded": [], "torch_hsdp": []}
    cpu = {"stoker_sharded": [], "torch_hsdp": []}  # rank 0's process CPU time a step (every thread)
    for i in range(repeats):
        name = "steady%d" % i
        proc = _launch(_example(data, tmp, name, batch, extra, epochs) + ["--shard"], os.path.join(tmp, name + ".log"))
        proc.wait(timeout=900)
        lines = _lines(os.path.join(tmp, name + ".jsonl"))
        results["stoker_sharded"].append(statistics.median(_gaps([r["t"] for r in lines])[4:]))
        cpu["stoker_sharded"].append(statistics.median(_gaps([r["cpu"] for r in lines])[4:]))
        native = _native_hsdp(data, tmp, "native%d" % i, extra, batch, "run")
        results["torch_hsdp"].append(statistics.median(native["times"][4:]))
        cpu["torch_hsdp"].append(statistics.median(native["cpu"][4:]))
        print(json.dumps({k: [round(v[-1] * 1000, 2), round(cpu[k][-1] * 1000, 2)] for k, v in results.items()}),
              flush=True)
    return results, cpu


def checkpoint(data, num_samples, tmp, repeats, extra, every):
    from elastic_train import check
    batch, epochs = 16, 2
    steady = {"none": [], "every": []}  # the mean step from step 5 (a save's cost lands in one step of --every)
    saves = []
    for i in range(repeats):
        for kind in ("none", "every"):
            name = "steady_%s%d" % (kind, i)
            flags = ["--shard"] + (["--checkpoint-dir", os.path.join(tmp, name + "_ckpt"), "--checkpoint-every",
                                    str(every)] if kind == "every" else [])
            proc = _launch(_example(data, tmp, name, batch, extra, epochs) + flags, os.path.join(tmp, name + ".log"))
            proc.wait(timeout=900)
            lines = _lines(os.path.join(tmp, name + ".jsonl"))
            steady[kind].append(statistics.mean(_gaps([r["t"] for r in lines])[4:]))
            if kind == "every":  # the writing group's training threads, each save
                saves += [t for r in _lines(os.path.join(tmp, name + "_summary.jsonl"))
                          for t in r.get("checkpoint_seconds", [])]
        print(json.dumps({"mean_step_ms_no_checkpoint": round(steady["none"][-1] * 1000, 2),
                          "mean_step_ms_checkpoint_every_%d" % every: round(steady["every"][-1] * 1000, 2)}),
              flush=True)
    reference = _reference(data, tmp, batch, epochs)
    runs = []
    for i in range(repeats):
        name = "lost%d" % i
        log_path = os.path.join(tmp, name + ".log")
        proc = _launch(_example(data, tmp, name, batch, 0.3, epochs) + [
            "--shard", "--checkpoint-dir", os.path.join(tmp, name + "_ckpt"), "--checkpoint-every", str(every)],
            log_path)
        steps = os.path.join(tmp, name + ".jsonl")
        _wait_logged(steps, 7, proc)
        workers = _workers(proc)  # local ranks 0-1 and 2-3: a worker of each group
        last = max(r["step"] for r in _lines(steps))
        killed = time.time()
        for victim in (workers[1], workers[3]):
            os.kill(victim, signal.SIGKILL)
        proc.wait(timeout=300)
        text = open(log_path).read()
        problems = check(steps, num_samples, epochs, batch) if proc.returncode == 0 else ["exit %d" % proc.returncode]
        restoring = [(_stamp(l), int(re.search(r"restoring step (\d+)", l).group(1))) for l in text.splitlines()
                     if "every replica group failed: restoring step" in l]
        runs.append({"exit": proc.returncode, "problems": problems,
                     "max_param_diff": _param_diff(reference, os.path.join(tmp, name + ".pt"))
                     if proc.returncode == 0 else None,
                     "to_restoring_s": round(restoring[0][0] - killed, 3) if restoring else None,
                     "restored_step": restoring[0][1] if restoring else None, "last_logged_step": last,
                     "steps_trained_again_at_least": last - restoring[0][1] if restoring else None})
        print(json.dumps(runs[-1]), flush=True)
    return {"steady_step_s": steady, "every_steps": every, "all_groups_lost": runs,
            "save_s": {"count": len(saves), "median": statistics.median(saves) if saves else None,
                       "max": max(saves) if saves else None}}


def _gaps(values):
    return [b - a for a, b in zip(values, values[1:])]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", help="a packed dataset (default: made here, 400 demo images)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--extra", type=float, default=0.1, help="seconds of sleep a step (a GPU's compute)")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the overhead runs (25 steps each)")
    ap.add_argument("--parts", default="recovery,overhead,checkpoint,trainer")
    ap.add_argument("--every", type=int, default=5, help="steps between checkpoints in the checkpoint part")
    ap.add_argument("--photos", help="the demo data's source photographs (scripts/make_demo_data.py --photos)")
    ap.add_argument("--amp", action="store_true", help="the trainer part with torch's GradScaler (torch >= 2.3 on "
                    "the CPU, in float32)")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception:  # noqa: BLE001 - absent before 2.6; torch 1.13's fsdp fails to import on Python 3.11
        raise SystemExit("bench/elastic_hsdp.py needs FSDP2 (torch >= 2.6); this is torch %s" % torch.__version__)
    import stoker
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), tmp + "/img",
                            "--classes", "4", "--per-class", "100", "--jobs", "2"] +
                           (["--photos", args.photos] if args.photos else []), check=True, capture_output=True)
            stoker.pack(tmp + "/img", tmp + "/packed")
            data = tmp + "/packed"
        num_samples = stoker._native.num_samples(data)
        result = {"torch": __import__("torch").__version__, "workers": 4, "group_size": 2}
        if "recovery" in args.parts:
            result["recovery"] = recovery(data, num_samples, tmp, args.repeats, 0.3)
        if "overhead" in args.parts:
            o, cpu = overhead(data, tmp, args.repeats, args.extra, 16, args.epochs)
            result["overhead"] = {k: {"median_step_s": statistics.median(v), "runs": v,
                                      "median_cpu_s": statistics.median(cpu[k]), "cpu_runs": cpu[k]}
                                  for k, v in o.items()}
            a, b = (statistics.median(o[k]) for k in ("stoker_sharded", "torch_hsdp"))
            ca, cb = (statistics.median(cpu[k]) for k in ("stoker_sharded", "torch_hsdp"))
            result["overhead"]["stoker_over_torch"] = a / b - 1
            print("step: stoker sharded %.2f ms, torch HSDP %.2f ms: %+.1f%%; rank 0's CPU a step: %.2f ms against "
                  "%.2f ms (%+.2f ms)" % (a * 1000, b * 1000, 100 * (a / b - 1), ca * 1000, cb * 1000,
                                         (ca - cb) * 1000))
        if "trainer" in args.parts:
            t = trainer(data, tmp, args.repeats, args.extra, 16, args.epochs, args.amp)
            a, b = (statistics.median(t[k]) for k in ("stoker_trainer_sharded", "torch_hsdp"))
            result["trainer"] = {k: {"median_step_s": statistics.median(v), "runs": v} for k, v in t.items()}
            result["trainer"]["stoker_over_torch"] = a / b - 1
            result["trainer"]["amp"] = args.amp
            print("Trainer step (2 micro-batches, clipping, StepLR%s): stoker sharded %.2f ms, torch HSDP %.2f ms: "
                  "%+.1f%%" % (", GradScaler" if args.amp else "", a * 1000, b * 1000, 100 * (a / b - 1)))
        if "checkpoint" in args.parts:
            c = checkpoint(data, num_samples, tmp, args.repeats, args.extra, args.every)
            result["checkpoint"] = c
            a, b = (statistics.median(c["steady_step_s"][k]) for k in ("every", "none"))
            print("mean step with a checkpoint every %d steps: %.2f ms against %.2f ms without (%+.1f%%); a save "
                  "on the training thread: median %s ms of %d" % (
                      args.every, a * 1000, b * 1000, 100 * (a / b - 1),
                      "%.2f" % (c["save_s"]["median"] * 1000) if c["save_s"]["median"] is not None else "-",
                      c["save_s"]["count"]))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
