#!/usr/bin/env python3
"""Elastic DDP, written as a user writes a DDP loop: their own loop, StepLR,
gradient clipping, accumulation over 2 micro-batches; stoker.elastic.Trainer
keeps it going when workers leave or join, every sample exactly once.

    python -m stoker.elastic.launch --in-process --nproc-per-node 3 --min-workers 1 --max-workers 4 \\
        examples/elastic_ddp.py --data demo-packed --epochs 2 --log steps.jsonl

Every rank appends one JSON line per committed optimizer step to --log:
{"step", "epoch", "rank", "world_size", "lr", "samples": [the dataset ids
this rank consumed in that step], "batch": [the global batch's ids],
"stepped" (False where a GradScaler skipped the step), "scale" (--amp: the
GradScaler's scale), "params_sha256"}. Then

    python examples/elastic_ddp.py --check steps.jsonl --data demo-packed --epochs 2

says whether each sample was seen exactly once per epoch, the replicas'
digests agree at every step, and the learning rate followed the schedule by
global step.
"""
import argparse
import contextlib
import hashlib
import json
import logging
import os
import sys
import time

STEP_SIZE, GAMMA = 3, 0.7  # StepLR


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a packed stoker dataset (stoker pack)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--log", help="append one JSON line per committed step and rank here")
    p.add_argument("--check", metavar="LOG", help="check LOG, then exit")
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep per step (to kill workers mid-run)")
    p.add_argument("--pause-while", metavar="PATH", help="before each step, wait while PATH exists (lets a test or "
                   "a demo hold the job still, e.g. while a joining worker starts)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a silent peer counts as failed")
    p.add_argument("--straggler", metavar="FACTOR:STEPS[:MIN_SECONDS]", help="evict a worker slower than FACTOR x "
                   "the others' median for STEPS steps in a row, steps under MIN_SECONDS not judged "
                   "(stoker.elastic.StragglerPolicy)")
    p.add_argument("--slow", metavar="LOCAL_RANK:SECONDS", help="the worker of this local rank computes SECONDS "
                   "longer each step (to try --straggler)")
    p.add_argument("--clip", type=float, default=1.0, help="clip the gradient's norm to this (a small one binds: "
                   "clipping then must see the whole batch's gradient)")
    p.add_argument("--checkpoint-dir", help="persistent checkpoints (stoker.Checkpointer's arguments: the trainer "
                   "opens it where it writes)")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--save-params", help="rank 0 saves the final parameters here (torch.save)")
    p.add_argument("--device", default="cpu", help="where the model trains (cuda: DDP on gloo reduces CUDA "
                                                   "tensors through the host)")
    p.add_argument("--shard", action="store_true", help="shard the model within each replica group (FSDP2 over "
                   "stoker.elastic.replica_group_mesh(); launch with --in-process --replica-group-size N)")
    p.add_argument("--amp", action="store_true", help="torch's GradScaler, with float16 autocast on a GPU; on the CPU "
                   "(torch >= 2.3) the scaler alone, in float32, to run its path; its state travels with the model")
    p.add_argument("--inf-at", metavar="STEP[:RANK]", help="(tests) add bias[0] x inf of the last layer to the loss "
                   "of global step STEP (on rank RANK only, or every rank): an infinite gradient in that one element, "
                   "which the scaler must skip on every worker (with --shard one worker's shard of a group holds it)")
    p.add_argument("--parts", type=int, default=2, help="micro-batches a step (1: one backward pass, without "
                   "trainer.accumulate)")
    return p.parse_args(argv)


def digest(model):
    """Of this worker's parameters (a sharded model's: its shards, the same in every replica group)."""
    h = hashlib.sha256()
    for p in model.parameters():
        p = p.to_local() if hasattr(p, "to_local") else p
        h.update(p.detach().cpu().numpy().tobytes())
    return h.hexdigest()


def shard_index():
    """This worker's shard in its replica group (--replica-group-size), else None."""
    spec = os.environ.get("STOKER_ELASTIC_REPLICA_GROUP")
    return int(spec.rsplit(":", 2)[1]) if spec else None


def check(log_path, num_samples, epochs, global_batch, lr):
    """Problems with the log: samples lost or repeated, replicas that differ, a learning rate off schedule."""
    problems, last = [], {}
    with open(log_path) as f:
        for line in f:
            rec = json.loads(line)
            # A restarted job (torchrun) commits the steps after its snapshot again: the last commit of each
            # step on each rank is the one the run went on from.
            last[(rec["step"], rec["rank"])] = rec
    steps = {}
    for (step, _), rec in sorted(last.items()):
        steps.setdefault(step, []).append(rec)
    expected_steps = epochs * -(-num_samples // global_batch)
    missing = sorted(set(range(expected_steps)) - set(steps))
    if missing:
        problems.append("steps never committed: %s" % missing[:20])
    for step, recs in sorted(steps.items()):
        shards = {}
        for r in recs:
            shards.setdefault(r.get("shard"), set()).add(r["params_sha256"])
        if any(len(digests) != 1 for digests in shards.values()):
            problems.append("step %d: the replicas' parameters differ" % step)
        if len({r.get("scale") for r in recs}) != 1:
            problems.append("step %d: the replicas' loss scales differ" % step)
        if len({tuple(r["batch"]) for r in recs}) != 1:
            problems.append("step %d: ranks disagree on the global batch" % step)
        mine = sorted(i for r in {r["rank"]: r for r in recs}.values() for i in r["samples"])
        if not set(mine) <= set(recs[0]["batch"]):
            problems.append("step %d: a rank consumed samples outside the global batch" % step)
        want = lr * GAMMA ** (step // STEP_SIZE)
        if any(abs(r["lr"] - want) > 1e-12 * want for r in recs):
            problems.append("step %d: lr %s, the schedule says %s" % (step, recs[0]["lr"], want))
    for epoch in range(epochs):
        seen = [i for recs in steps.values() if recs[0]["epoch"] == epoch for i in recs[0]["batch"]]
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
        problems = check(args.check, n, args.epochs, args.global_batch, args.lr)
        for p in problems:
            print("FAIL:", p)
        if not problems:
            print("OK: %d samples x %d epochs, each exactly once; replicas agree; lr on schedule" % (n, args.epochs))
        return 1 if problems else 0

    on_gpu = args.device.startswith("cuda")
    if args.amp and not on_gpu and not hasattr(getattr(torch, "amp", None), "GradScaler"):
        print("elastic_ddp.py: --amp needs --device cuda on torch %s (torch's GradScaler on the CPU needs torch 2.3 "
              "or newer)" % torch.__version__, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                          nn.Linear(8 * 16, 32), nn.ReLU(), nn.Linear(32, 10)).to(args.device)
    if args.shard:
        from torch.distributed.fsdp import fully_shard
        mesh = stoker.elastic.replica_group_mesh("cpu")
        for layer in model:
            if any(True for _ in layer.parameters()):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    poisoned = []  # --inf-at: a term through the last layer's bias[0], taken as its forward pass starts (sharded:
    # after FSDP gathered the parameter, so that the gradient goes through FSDP's reduce-scatter)
    if args.inf_at is not None:
        inf_step, _, inf_rank = args.inf_at.partition(":")

        def poison(module, inputs):
            if int(inf_step) == trainer.global_step + 1 and torch.is_grad_enabled() and \
                    inf_rank in ("", str(trainer.rank)):
                poisoned.append(module.bias[0] * float("inf"))
        model[-1].register_forward_pre_hook(poison)  # after FSDP's own, which gathers the parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=STEP_SIZE, gamma=GAMMA)
    scaler = None
    if args.amp:
        scaler = torch.cuda.amp.GradScaler() if on_gpu and not hasattr(torch.amp, "GradScaler") else \
            torch.amp.GradScaler("cuda" if on_gpu else "cpu")
    loader = stoker.Loader(args.data, global_batch_size=args.global_batch, with_indices=True, num_threads=1,
                           log_epochs=False, transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))

    # The learning rate the step trains with: a step the scaler skipped commits when the body has ended, after
    # the scheduler's step, whose rate is the next step's.
    step_lr = [optimizer.param_groups[0]["lr"]]

    def log_step(info):
        if args.log:
            line = json.dumps({"step": info["step"], "epoch": info["epoch"], "rank": info["rank"], "pid": os.getpid(),
                               "world_size": info["world_size"], "lr": step_lr[0],
                               "samples": info["rank_samples"], "batch": info["samples"],
                               "stepped": info["stepped"], "scale": scaler.get_scale() if scaler else None,
                               "params_sha256": digest(model), "shard": shard_index() if args.shard else None,
                               "t": round(time.time(), 4)}) + "\n"
            fd = os.open(args.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())  # one write: a killed writer leaves no torn line
            finally:
                os.close(fd)

    straggler = stoker.elastic.StragglerPolicy.from_spec(args.straggler) if args.straggler else None
    slow = 0.0
    if args.slow:
        local_rank, seconds = args.slow.split(":")
        slow = float(seconds) if os.environ.get("LOCAL_RANK") == local_rank else 0.0
    checkpointer = dict(directory=args.checkpoint_dir, keep_last=2, every_steps=args.checkpoint_every) \
        if args.checkpoint_dir else None
    trainer = stoker.elastic.Trainer(model, optimizer, loader, epochs=args.epochs, scheduler=scheduler,
                                     scaler=scaler, on_commit=log_step, timeout=args.timeout, straggler=straggler,
                                     checkpointer=checkpointer)
    for images, labels, _ in trainer:
        while args.pause_while and os.path.exists(args.pause_while):
            time.sleep(0.05)
        step_lr[0] = optimizer.param_groups[0]["lr"]
        with trainer.step():
            images, labels = images.to(args.device, non_blocking=True), labels.to(args.device, non_blocking=True)
            if slow:
                time.sleep(slow)  # a slower machine: before the backward pass, so DDP waits for it
            parts = trainer.accumulate(images, labels, parts=args.parts) if args.parts > 1 else \
                [(images, labels, trainer.loss_weight(len(images)))]
            for x, y, weight in parts:
                with torch.autocast("cuda", dtype=torch.float16) if args.amp and on_gpu else contextlib.nullcontext():
                    loss = nn.functional.cross_entropy(trainer.model(x), y % 10) * weight
                if poisoned:
                    loss = loss + poisoned.pop()
                (scaler.scale(loss) if scaler else loss).backward()
            if args.step_delay:
                time.sleep(args.step_delay)
            if scaler:
                scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), args.clip)
            if scaler:
                scaler.step(optimizer)  # skips optimizer.step() on inf gradients: the batch commits unstepped
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    if args.save_params and not trainer.summary.left_behind and not trainer.summary.evicted and \
            (args.shard or trainer.rank == 0):
        # A sharded model's full tensors are gathered by every worker of the group (a collective).
        params = {k: v.full_tensor() if hasattr(v, "full_tensor") else v.clone() for k, v in model.state_dict().items()}
        if trainer.rank == 0:
            torch.save(params, args.save_params + ".tmp")
            os.replace(args.save_params + ".tmp", args.save_params)
    logging.getLogger("stoker.elastic").info("done: %r", trainer.summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
