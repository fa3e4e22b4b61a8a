#!/usr/bin/env python3
"""The peer baseline for bench/elastic_recovery.py: the same DDP job as
examples/elastic_ddp.py (model, StepLR, clipping, 2 micro-batches, global
batch, step delay) written without stoker, as a careful user writes one for
torchrun: torchvision's ImageFolder on the unpacked demo images, a
DistributedSampler, rank 0 writing a torch.save checkpoint every
--checkpoint-every steps (to a temporary name, then renamed), and on
(re)start loading the newest one and skipping the batches of the epoch
already trained. torchrun restarts every worker when one dies.

It logs the same lines as examples/elastic_ddp.py (--log), so the same
check applies: the global batch of a step is every rank's share, which
DistributedSampler's order lets each rank compute.
"""
import argparse
import os
import sys
import time

from ddp_job import append_line, backward_in_two, digest, image_folder, make_job


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", required=True, help="an image folder (class folders), as make_demo_data.py writes")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--step-delay", type=float, default=0.0)
    p.add_argument("--log")
    p.add_argument("--checkpoint", required=True, help="the checkpoint file (rank 0 writes it)")
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--timeout", type=float, default=10.0)
    args = p.parse_args()

    import datetime
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler = make_job(args.lr)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    dataset = image_folder(args.images)
    per_rank = args.global_batch // world
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=world, rank=rank, seed=0)
    steps_per_epoch = -(-sampler.num_samples // per_rank)

    step = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]


    for epoch in range(step // steps_per_epoch, args.epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)  # this rank's share
        everyone = []  # every rank's share, as DistributedSampler deals them (for the log's global batch)
        for r in range(world):
            sampler.rank = r
            everyone.append(list(sampler))
        sampler.rank = rank
        skip = step - epoch * steps_per_epoch  # batches of this epoch already in the checkpoint
        for b in range(skip, steps_per_epoch):
            mine = order[b * per_rank:(b + 1) * per_rank]
            batch = [i for share in everyone for i in share[b * per_rank:(b + 1) * per_rank]]
            backward_in_two(ddp, dataset, mine)
            if args.step_delay:
                time.sleep(args.step_delay)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if args.log:
                append_line(args.log, {"step": step, "epoch": epoch, "rank": rank, "pid": os.getpid(),
                                       "world_size": world, "lr": lr, "samples": mine, "batch": batch,
                                       "params_sha256": digest(model)})
            step += 1
            if rank == 0 and step % args.checkpoint_every == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step}, args.checkpoint + ".tmp")
                os.replace(args.checkpoint + ".tmp", args.checkpoint)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
