#!/usr/bin/env python3
"""A small, real elastic training run on a stoker dataset.

    python -m stoker.elastic.launch --in-process --nproc-per-node 3 --min-workers 1 --max-workers 4 \\
        examples/elastic_train.py --data demo-packed --epochs 2 --log steps.jsonl

Kill any worker at any moment (or start another launcher on the same
--rdzv-endpoint to add one), then check the log: one JSON line per committed
step, {"step", "epoch", "world_size", "samples": [the global batch's ids]},
and every sample id appears exactly once per epoch:

    python examples/elastic_train.py --check steps.jsonl --data demo-packed --epochs 2

Runs unchanged under torchrun / `python -m stoker.elastic.launch` (workers
restart from in-memory snapshots) and as one plain process.
"""
import argparse
import json
import logging
import os
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a packed stoker dataset (stoker pack)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--log", help="append one JSON line per committed step here")
    p.add_argument("--check", metavar="LOG", help="check LOG: every sample exactly once per epoch, then exit")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=1, help="loader threads per worker")
    p.add_argument("--checkpoint-dir", help="persistent checkpoints (stoker.Checkpointer)")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (to kill workers mid-run)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a silent peer counts as failed")
    p.add_argument("--straggler", metavar="FACTOR:STEPS[:MIN_SECONDS]", help="evict a worker slower than FACTOR x "
                   "the others' median for STEPS steps in a row, steps under MIN_SECONDS not judged "
                   "(stoker.elastic.StragglerPolicy)")
    p.add_argument("--pause-while", metavar="PATH", help="before each step, wait while PATH exists (lets a test "
                   "hold every worker at the same point, outside any collective, while a joiner starts)")
    p.add_argument("--slow", metavar="LOCAL_RANK:SECONDS", help="the worker of this local rank computes SECONDS "
                   "longer each step (to try --straggler)")
    p.add_argument("--snapshot-copies", type=int, default=2,
                   help="under torchrun: local ranks keeping an in-memory snapshot per step (0: none, resume from "
                        "--checkpoint-dir only)")
    p.add_argument("--rendezvous-timeout", type=float, default=600.0,
                   help="seconds to wait for the minimum number of workers")
    p.add_argument("--shard", action="store_true", help="shard the model within each replica group (FSDP2 over "
                   "stoker.elastic.replica_group_mesh(); launch with --in-process --replica-group-size N; torch >= 2.6)")
    p.add_argument("--save-params", help="rank 0 saves the final parameters here (torch.save)")
    p.add_argument("--summary", help="each worker appends its RunSummary as a JSON line here")
    return p.parse_args(argv)


class StepLog:
    """Appends one line per committed step. A step already in the file is not written twice: the new rank 0
    replays the last commit after a failure, and a restart of every worker from a snapshot older than the
    last commit trains and commits the steps after it again (the same samples, from the same position)."""

    def __init__(self, path):
        self.path = path
        self.read_to, self.last = 0, -1  # the lines read so far (other processes append too), and their last step

    def last_step(self):
        """The newest step in the file: only the lines appended since the last call are read."""
        if not os.path.exists(self.path):
            return -1
        with open(self.path, "rb") as f:
            f.seek(self.read_to)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # never torn (one write a line); read again next time all the same
                self.read_to += len(line)
                try:
                    self.last = max(self.last, json.loads(line)["step"])
                except (ValueError, KeyError):
                    pass
        return self.last

    def __call__(self, info):
        if self.last_step() >= info["step"]:
            return
        line = json.dumps({"step": info["step"], "epoch": info["epoch"], "world_size": info["world_size"],
                           "samples": info["samples"], "loss": round(info["loss"], 6),
                           "t": round(time.time(), 4), "cpu": round(time.process_time(), 4)}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write: a killed writer leaves no torn line
        finally:
            os.close(fd)


def check(log_path, num_samples, epochs, global_batch):
    """Returns a list of problems with the log (empty when every sample was seen exactly once per epoch)."""
    problems = []
    steps = {}
    with open(log_path) as f:
        for n, line in enumerate(f, 1):
            rec = json.loads(line)
            if rec["step"] in steps:
                problems.append("line %d: step %d logged twice" % (n, rec["step"]))
            steps[rec["step"]] = rec
    expected_steps = epochs * -(-num_samples // global_batch)
    missing = sorted(set(range(expected_steps)) - set(steps))
    if missing:
        problems.append("steps never committed: %s" % missing[:20])
    for epoch in range(epochs):
        seen = [i for r in steps.values() if r["epoch"] == epoch for i in r["samples"]]
        dup = len(seen) - len(set(seen))
        lost = sorted(set(range(num_samples)) - set(seen))
        if dup:
            problems.append("epoch %d: %d samples repeated" % (epoch, dup))
        if lost:
            problems.append("epoch %d: %d samples never seen, e.g. %s" % (epoch, len(lost), lost[:10]))
    return problems


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=os.environ.get("STOKER_LOG_LEVEL", "INFO"),
                        format="%(asctime)s [pid %(process)d] %(message)s")
    import stoker
    import stoker.elastic
    import stoker.transforms as T
    import torch
    from torch import nn

    if args.check:
        n = stoker._native.num_samples(args.data)
        problems = check(args.check, n, args.epochs, args.global_batch)
        for p in problems:
            print("FAIL:", p)
        if not problems:
            print("OK: %d samples x %d epochs, each exactly once" % (n, args.epochs))
        return 1 if problems else 0

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    s = args.image_size
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10))
    if args.shard:
        from torch.distributed.fsdp import fully_shard
        mesh = stoker.elastic.replica_group_mesh("cpu")
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    transform = T.Compose([T.RandomResizedCrop(s), T.RandomHorizontalFlip(),
                           T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    loader = stoker.Loader(args.data, global_batch_size=args.global_batch, seed=args.seed, transform=transform,
                           with_indices=True, num_threads=args.threads, log_epochs=False)
    # Arguments, not a Checkpointer: whichever worker is rank 0 opens it.
    checkpointer = dict(directory=args.checkpoint_dir, keep_last=2, every_steps=args.checkpoint_every) \
        if args.checkpoint_dir else None

    straggler = stoker.elastic.StragglerPolicy.from_spec(args.straggler) if args.straggler else None
    slow = 0.0
    if args.slow:
        local_rank, seconds = args.slow.split(":")
        slow = float(seconds) if os.environ.get("LOCAL_RANK") == local_rank else 0.0

    def train_step(images, labels):
        while args.pause_while and os.path.exists(args.pause_while):
            time.sleep(0.05)  # heartbeats go on; no collective is in flight here
        if args.step_delay or slow:
            time.sleep(args.step_delay + slow)
        return nn.functional.cross_entropy(model(images), labels % 10)

    try:
        summary = stoker.elastic.run(train_step, model=model, optimizer=optimizer, loader=loader,
                                     epochs=args.epochs,
                                     checkpointer=checkpointer, on_commit=StepLog(args.log) if args.log else None,
                                     timeout=args.timeout, rendezvous_timeout=args.rendezvous_timeout,
                                     snapshot_copies=args.snapshot_copies, straggler=straggler)
    except stoker.elastic.ElasticError as e:
        logging.getLogger("stoker.elastic").error("elastic training stopped: %s", e)
        return 2
    if args.summary:
        with open(args.summary, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "steps": summary.steps, "reconfigurations": summary.reconfigurations,
                                "recomputed_steps": summary.recomputed_steps,
                                "world_sizes": summary.world_sizes, "restored_step": summary.restored_step,
                                "recovery_seconds": summary.recovery_seconds, "evicted": summary.evicted,
                                "checkpoint_seconds": summary.checkpoint_seconds,
                                "local_rank": os.environ.get("LOCAL_RANK")}) + "\n")
    if args.save_params and summary.world_sizes and not summary.left_behind and not summary.evicted:
        # A sharded model's full tensors are gathered by every worker of the group (a collective).
        params = {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone()
                  for k, v in model.state_dict().items()} if args.shard or _is_rank0(loader) else None
        if _is_rank0(loader):
            torch.save(params, args.save_params + ".tmp")
            os.replace(args.save_params + ".tmp", args.save_params)
    logging.getLogger("stoker.elastic").info("done: %r", summary)
    return 0


def _is_rank0(loader):
    return loader.rank == 0


if __name__ == "__main__":
    sys.exit(main())
