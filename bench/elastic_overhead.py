#!/usr/bin/env python3
"""Steady-state cost of stoker.elastic.Trainer over the same DDP loop without
it: 3 workers on gloo (CPU) under the launcher's torchrun path, the loop of
examples/elastic_ddp.py (a small CNN, 2 micro-batches, clipping, StepLR),
steps/s from step 10 on, with and without extra compute per step.

    PYTHONPATH=build/release/python .venv/bin/python bench/elastic_overhead.py [--repeats 3]

Each rank's time per step, and its process's CPU time per step (every
thread: the loader's, gloo's, the snapshot's background write; steadier
than wall time on a shared 2-core VM). The Trainer adds one small collective a step
(the commit: sample ids, members, joins) and its snapshot (as often as
keeps it within 0.5% of step time). With --torchft, also the same loop on
torchft 0.2 (one replica group per torchrun, a lighthouse, torchft's DDP
and optimizer wrapper, the same loader shares): run this with a Python
that has torch >= 2.7 and torchft (see bench/elastic_recovery.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = r"""
import json, os, statistics, sys, time, torch, stoker, stoker.elastic, stoker.transforms as T
import torch.distributed as dist
from torch import nn
mode, data, extra, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
torch.manual_seed(0); torch.set_num_threads(1)
model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                      nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7)
kw = dict(global_batch_size=48, with_indices=True, num_threads=1, log_epochs=False,
          transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
times, cpu, participants = [], [], []  # torchft: replica groups in each step's quorum
def step(ddp, images, labels, micro, start=None, commits=None):
    if start: start()  # torchft: the step's quorum, before the forward pass
    for x, y, w in micro(images, labels):
        (nn.functional.cross_entropy(ddp(x), y % 10) * w).backward()
    if extra:
        time.sleep(extra)
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    if commits is None or commits():
        opt.step(); sched.step()
    opt.zero_grad()
def halves(ddp, world):  # 2 micro-batches, the first without DDP's all-reduce
    def micro(images, labels):
        n = len(labels); half = n // 2
        with ddp.no_sync():
            yield images[:half], labels[:half], half * world / 48
        yield images[half:], labels[half:], (n - half) * world / 48
    return micro
def timed(batches):  # each step's time and the process's CPU time (every thread's), batch to batch
    last = last_cpu = None
    for b in batches:
        now, now_cpu = time.perf_counter(), time.process_time()
        if last is not None:
            times.append(now - last); cpu.append(now_cpu - last_cpu)
        last, last_cpu = now, now_cpu
        yield b
def epochs(loader):
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        yield from loader
EPOCHS = 20
if mode in ("trainer", "straggler"):
    policy = stoker.elastic.StragglerPolicy(action="warn") if mode == "straggler" else None
    trainer = stoker.elastic.Trainer(model, opt, stoker.Loader(data, **kw), epochs=EPOCHS, scheduler=sched,
                                     straggler=policy)
    for images, labels, _ in timed(trainer):
        with trainer.step():
            step(trainer.model, images, labels, lambda a, b: trainer.accumulate(a, b, parts=2))
    rank = trainer.rank
elif mode == "torchft":
    from datetime import timedelta
    import torchft
    rank, world = int(os.environ["REPLICA_GROUP_ID"]), int(os.environ["NUM_REPLICA_GROUPS"])
    state = lambda: {"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict()}
    def load(s):
        model.load_state_dict(s["model"]); opt.load_state_dict(s["opt"]); sched.load_state_dict(s["sched"])
    manager = torchft.Manager(pg=torchft.ProcessGroupGloo(timeout=timedelta(seconds=30)), min_replica_size=1,
                              load_state_dict=load, state_dict=state, replica_id="overhead_%d" % rank,
                              init_sync=False)
    ddp = torchft.DistributedDataParallel(manager, model)
    loader = stoker.Loader(data, rank=rank, world_size=world, **kw)
    barrier = out + ".start"
    os.makedirs(barrier, exist_ok=True); open(os.path.join(barrier, str(rank)), "w").close()
    while len(os.listdir(barrier)) < world: time.sleep(0.05)  # the first quorum has every replica group
    micro = halves(ddp, world)
    for images, labels, _ in timed(epochs(loader)):
        step(ddp, images, labels, micro, manager.start_quorum, manager.should_commit)
        participants.append(manager.num_participants())
    manager.shutdown(wait=False)
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = stoker.Loader(data, rank=rank, world_size=world, **kw)
    ddp = nn.parallel.DistributedDataParallel(model)
    micro = halves(ddp, world)
    for images, labels, _ in timed(epochs(loader)):
        step(ddp, images, labels, micro)
steady = times[10:]
with open("%s.%d" % (out, rank), "w") as f:
    json.dump({"mode": mode, "step_ms": 1000 * statistics.median(steady),
               "cpu_ms": 1000 * statistics.mean(cpu[10:]), "steps": len(times) + 1,
               "participants": sorted(set(participants))}, f)
"""


def run_torchft(script, data, extra, out, workers):
    """A lighthouse and one single-process torchrun per replica group, as torchft's README runs them."""
    from elastic_recovery import free_port
    port = free_port()
    lighthouse = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse"), "--bind",
                                   "[::]:%d" % port, "--min_replicas", str(max(1, workers // 2 + 1)), "--quorum_tick_ms", "100",
                                   "--join_timeout_ms", "10000"], stdout=subprocess.DEVNULL,
                                  stderr=open(out + ".lighthouse.log", "w"))
    try:
        runs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                  "1", "--", script, "torchft", data, str(extra), out],
                                 env=dict(os.environ, TORCHFT_LIGHTHOUSE="http://localhost:%d" % port,
                                          REPLICA_GROUP_ID=str(r), NUM_REPLICA_GROUPS=str(workers)),
                                 stdout=open("%s.replica%d.log" % (out, r), "w"), stderr=subprocess.STDOUT)
                for r in range(workers)]
        for r, p in enumerate(runs):
            if p.wait() != 0:
                with open("%s.replica%d.log" % (out, r)) as f:
                    raise SystemExit("torchft run failed:\n%s" % f.read()[-3000:])
    finally:
        lighthouse.kill()
        lighthouse.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--extra", type=float, help="one setting of extra compute per step (seconds)")
    ap.add_argument("--straggler", action="store_true",
                    help="also the Trainer with StragglerPolicy(action='warn'): the cost of its timing comm hook")
    ap.add_argument("--torchft", action="store_true", help="also the same loop on torchft")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stoker-elastic-overhead-")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), os.path.join(work, "img"),
                    "--classes", "4", "--per-class", "50", "--jobs", "2"], check=True, capture_output=True)
    import stoker
    data = os.path.join(work, "packed")
    stoker.pack(os.path.join(work, "img"), data)
    script = os.path.join(work, "worker.py")
    with open(script, "w") as f:
        f.write(WORKER)
    rows = []
    for extra in (0.0, 0.05) if args.extra is None else (args.extra,):
        per_mode, cpu_per_mode = {}, {}  # each run's median step (wall) and mean CPU a rank's step
        for _ in range(args.repeats):
            for mode in ("plain", "trainer") + (("straggler",) if args.straggler else ()) + (
                    ("torchft",) if args.torchft else ()):
                out = os.path.join(work, "r-%s-%s-%f" % (mode, time.monotonic(), extra))
                if mode == "torchft":
                    run_torchft(script, data, extra, out, args.workers)
                else:
                    run = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", "--standalone",
                                          "--nproc-per-node", str(args.workers), "--max-restarts", "0", script,
                                          mode, data, str(extra), out], capture_output=True, text=True)
                    if run.returncode != 0:
                        raise SystemExit("%s run failed:\n%s" % (mode, run.stdout[-3000:] + run.stderr[-3000:]))
                runs = [json.load(open("%s.%d" % (out, r))) for r in range(args.workers)]
                if mode == "torchft" and any(r["participants"] != [args.workers] for r in runs):
                    raise SystemExit("torchft: a step's quorum lacked a replica group: %s" % runs)
                ms = [r["step_ms"] for r in runs]
                per_mode.setdefault(mode, []).append(statistics.median(ms))
                cpu_per_mode.setdefault(mode, []).append(statistics.mean(r["cpu_ms"] for r in runs))
        plain, trainer = statistics.median(per_mode["plain"]), statistics.median(per_mode["trainer"])
        rows.append({"extra_compute_ms": 1000 * extra, "plain_step_ms": plain, "trainer_step_ms": trainer,
                     "overhead": trainer / plain - 1, "plain_runs": per_mode["plain"],
                     "trainer_runs": per_mode["trainer"],
                     "plain_cpu_ms": statistics.median(cpu_per_mode["plain"]),
                     "trainer_cpu_ms": statistics.median(cpu_per_mode["trainer"])})
        if args.straggler:
            timed = statistics.median(per_mode["straggler"])
            rows[-1].update(straggler_step_ms=timed, straggler_runs=per_mode["straggler"])
            print("extra compute %3.0f ms: Trainer with StragglerPolicy %.2f ms a step (%+.1f%% over plain DDP, "
                  "%+.1f%% over the Trainer); runs %s" % (1000 * extra, timed, 100 * (timed / plain - 1),
                                                          100 * (timed / trainer - 1),
                                                          ["%.2f" % x for x in per_mode["straggler"]]), flush=True)
        if args.torchft:
            ft = statistics.median(per_mode["torchft"])
            rows[-1].update(torchft_step_ms=ft, torchft_runs=per_mode["torchft"])
            print("extra compute %3.0f ms: torchft %.2f ms a step (%+.1f%% over plain DDP); runs %s" % (
                1000 * extra, ft, 100 * (ft / plain - 1), ["%.2f" % x for x in per_mode["torchft"]]), flush=True)
        print("extra compute %3.0f ms: plain DDP %.2f ms a step, Trainer %.2f ms (%+.1f%%); runs %s vs %s; "
              "CPU a rank's step (every thread of the process) %.2f vs %.2f ms" % (
                  1000 * extra, plain, trainer, 100 * (trainer / plain - 1),
                  ["%.2f" % x for x in per_mode["plain"]], ["%.2f" % x for x in per_mode["trainer"]],
                  rows[-1]["plain_cpu_ms"], rows[-1]["trainer_cpu_ms"]), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
