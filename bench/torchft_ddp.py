#!/usr/bin/env python3
"""The torchft peer for bench/elastic_recovery.py (case torchft): the same
DDP job as examples/elastic_ddp.py and bench/plain_ddp.py (model, StepLR,
clipping, 2 micro-batches, step delay) written for torchft 0.2 as its own
train_ddp.py example writes it: one replica group per torchrun, a
torchft.Manager over a reconfigurable gloo group and a lighthouse,
torchft.DistributedDataParallel, and torchft.DistributedSampler (each
replica group a fixed share of every epoch). A restarted replica group
receives the live state from a peer (model, optimizer, scheduler, step).

Written as a careful user writes it: training is counted by the manager's
step, and a replica takes the batch of that step from its own share, so a
step whose commit failed is retried with the same batch and a restarted
replica resumes where the others are. Needs torch >= 2.7 and torchft
(not installed by stoker; see the bench's docstring).

One JSON line per step and replica group goes to --log: {"step", "epoch",
"rank" (the replica group), "pid", "world_size" (replica groups in the
step's quorum), "participating" (False while a replica heals: its
gradients are not counted), "committed", "lr", "samples",
"params_sha256"}. check() says which samples each epoch trained never or
more than once: torchft.DistributedSampler's share of a replica group
that is away is not trained ("inherently lossy", its docstring says).
"""
import argparse
import json
import os
import sys
import time

from ddp_job import GAMMA, STEP_SIZE, append_line, backward_in_two, digest, image_folder, make_job


def check(log_path, num_samples, epochs, lr):
    """Problems: samples no participating replica trained in a committed step, or trained twice; replicas whose
    parameters differ after the same committed step; a learning rate off schedule."""
    problems, trained, digests = [], {}, {}
    with open(log_path) as f:
        recs = [json.loads(line) for line in f]
    last = {}
    for rec in recs:
        if rec["committed"]:
            last[(rec["step"], rec["rank"])] = rec  # a restarted replica may log a step again
    for (step, _), rec in sorted(last.items()):
        digests.setdefault(step, set()).add(rec["params_sha256"])
        want = lr * GAMMA ** (step // STEP_SIZE)
        if abs(rec["lr"] - want) > 1e-12 * want:
            problems.append("step %d: lr %s, the schedule says %s" % (step, rec["lr"], want))
        if rec["participating"]:
            trained.setdefault(rec["epoch"], []).extend(rec["samples"])
    for step, ds in sorted(digests.items()):
        if len(ds) != 1:
            problems.append("step %d: the replicas' parameters differ" % step)
    for epoch in range(epochs):
        seen = trained.get(epoch, [])
        dup = len(seen) - len(set(seen))
        lost = sorted(set(range(num_samples)) - set(seen))
        if dup:
            problems.append("epoch %d: %d samples repeated" % (epoch, dup))
        if lost:
            problems.append("epoch %d: %d samples never trained, e.g. %s" % (epoch, len(lost), lost[:10]))
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, help="an image folder (class folders), as make_demo_data.py writes")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=16, help="split evenly over --replica-groups (rounded down)")
    p.add_argument("--replica-groups", type=int, default=int(os.environ.get("NUM_REPLICA_GROUPS", 3)))
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--log")
    p.add_argument("--timeout", type=float, default=10.0, help="the gloo group's timeout (s)")
    p.add_argument("--start-barrier", metavar="DIR", help="before the first step, wait until every replica group "
                   "has a manager (a file each in DIR), so the first quorum has them all (a bench's fair start)")
    args = p.parse_args()

    from datetime import timedelta
    import torch
    from torchft import DistributedDataParallel, DistributedSampler, Manager, ProcessGroupGloo

    replica = int(os.environ.get("REPLICA_GROUP_ID", 0))
    model, optimizer, scheduler = make_job(args.lr)

    def state_dict():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict()}

    def load_state_dict(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])

    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=args.timeout)), min_replica_size=1,
                      load_state_dict=load_state_dict, state_dict=state_dict, replica_id="bench_%d" % replica,
                      timeout=timedelta(seconds=30), init_sync=False)  # every replica seeds its model alike
    ddp = DistributedDataParallel(manager, model)
    dataset = image_folder(args.images)
    sampler = DistributedSampler(dataset, replica_rank=replica, num_replica_groups=args.replica_groups,
                                 group_rank=0, num_replicas=1, shuffle=True, seed=0)
    per_replica = args.global_batch // args.replica_groups
    steps_per_epoch = -(-sampler.num_samples // per_replica)
    shares = {}

    if args.start_barrier:
        os.makedirs(args.start_barrier, exist_ok=True)
        open(os.path.join(args.start_barrier, str(replica)), "w").close()
        while len(os.listdir(args.start_barrier)) < args.replica_groups:
            time.sleep(0.05)
    while True:
        manager.start_quorum()  # what torchft.Optimizer.zero_grad() does; healing may change the step
        optimizer.zero_grad()
        step = manager.current_step()
        if step >= args.epochs * steps_per_epoch:
            break
        epoch, b = divmod(step, steps_per_epoch)
        if epoch not in shares:
            sampler.set_epoch(epoch)
            shares[epoch] = list(sampler)
        mine = shares[epoch][b * per_replica:(b + 1) * per_replica]
        backward_in_two(ddp, dataset, mine)
        if args.step_delay:
            time.sleep(args.step_delay)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        participating = manager.is_participating()
        world = manager.num_participants()
        committed = manager.should_commit()  # a healing replica takes the peer's state here
        lr = optimizer.param_groups[0]["lr"]
        if committed:
            step = manager.current_step() - 1  # healed: the step the peers committed
            optimizer.step()
            scheduler.step()
        if args.log:
            append_line(args.log, {"step": step, "epoch": step // steps_per_epoch, "rank": replica,
                                   "pid": os.getpid(), "world_size": world, "participating": participating,
                                   "committed": committed, "lr": lr, "samples": mine,
                                   "params_sha256": digest(model)})
    manager.shutdown(wait=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
