#!/usr/bin/env python3
"""Steady-state cost of stoker.elastic.Trainer over the same DDP loop without
it: 3 workers on gloo (CPU) under the launcher's torchrun path, the loop of
examples/elastic_ddp.py (a small CNN, 2 micro-batches, clipping, StepLR),
steps/s from step 10 on, with and without extra compute per step.

    PYTHONPATH=build/release/python .venv/bin/python bench/elastic_overhead.py [--repeats 3]

Each rank's time per step; the Trainer adds one small collective a step
(the commit: sample ids, members, joins) and its snapshot (as often as
keeps it within 1% of step time).
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
times = []
def body(ddp, images, labels, weight_of, micro):
    t0 = time.perf_counter()
    for i, (x, y, w) in enumerate(micro(images, labels)):
        (nn.functional.cross_entropy(ddp(x), y % 10) * w).backward()
    if extra:
        time.sleep(extra)
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    opt.step(); sched.step(); opt.zero_grad()
EPOCHS = 20
if mode in ("trainer", "straggler"):
    policy = stoker.elastic.StragglerPolicy(action="warn") if mode == "straggler" else None
    trainer = stoker.elastic.Trainer(model, opt, stoker.Loader(data, **kw), epochs=EPOCHS, scheduler=sched,
                                     straggler=policy)
    last = None
    for images, labels, _ in trainer:
        now = time.perf_counter()
        if last is not None: times.append(now - last)
        last = now
        with trainer.step():
            body(trainer.model, images, labels, trainer.loss_weight,
                 lambda a, b: trainer.accumulate(a, b, parts=2))
    rank = trainer.rank
else:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    loader = stoker.Loader(data, rank=rank, world_size=world, **kw)
    ddp = nn.parallel.DistributedDataParallel(model)
    def micro(images, labels):
        n = len(labels); half = n // 2
        with ddp.no_sync():
            yield images[:half], labels[:half], half * world / 48
        yield images[half:], labels[half:], (n - half) * world / 48
    last = None
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        for images, labels, _ in loader:
            now = time.perf_counter()
            if last is not None: times.append(now - last)
            last = now
            body(ddp, images, labels, None, micro)
steady = times[10:]
with open("%s.%d" % (out, rank), "w") as f:
    json.dump({"mode": mode, "step_ms": 1000 * statistics.median(steady), "steps": len(times) + 1}, f)
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--extra", type=float, help="one setting of extra compute per step (seconds)")
    ap.add_argument("--straggler", action="store_true",
                    help="also the Trainer with StragglerPolicy(action='warn'): the cost of its timing comm hook")
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
        per_mode = {}
        for _ in range(args.repeats):
            for mode in ("plain", "trainer") + (("straggler",) if args.straggler else ()):
                out = os.path.join(work, "r-%s-%s-%f" % (mode, time.monotonic(), extra))
                run = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", "--standalone",
                                      "--nproc-per-node", str(args.workers), "--max-restarts", "0", script, mode,
                                      data, str(extra),
                                      out], capture_output=True, text=True)
                if run.returncode != 0:
                    raise SystemExit("%s run failed:\n%s" % (mode, run.stdout[-3000:] + run.stderr[-3000:]))
                ms = [json.load(open("%s.%d" % (out, r)))["step_ms"] for r in range(args.workers)]
                per_mode.setdefault(mode, []).append(statistics.median(ms))
        plain, trainer = statistics.median(per_mode["plain"]), statistics.median(per_mode["trainer"])
        rows.append({"extra_compute_ms": 1000 * extra, "plain_step_ms": plain, "trainer_step_ms": trainer,
                     "overhead": trainer / plain - 1, "plain_runs": per_mode["plain"],
                     "trainer_runs": per_mode["trainer"]})
        if args.straggler:
            timed = statistics.median(per_mode["straggler"])
            rows[-1].update(straggler_step_ms=timed, straggler_runs=per_mode["straggler"])
            print("extra compute %3.0f ms: Trainer with StragglerPolicy %.2f ms a step (%+.1f%% over plain DDP, "
                  "%+.1f%% over the Trainer); runs %s" % (1000 * extra, timed, 100 * (timed / plain - 1),
                                                          100 * (timed / trainer - 1),
                                                          ["%.2f" % x for x in per_mode["straggler"]]), flush=True)
        print("extra compute %3.0f ms: plain DDP %.2f ms a step, Trainer %.2f ms (%+.1f%%); runs %s vs %s" % (
            1000 * extra, plain, trainer, 100 * (trainer / plain - 1), ["%.2f" % x for x in per_mode["plain"]],
            ["%.2f" % x for x in per_mode["trainer"]]), flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
