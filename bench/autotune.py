"""Autotune's convergence: a training loop of fixed compute per step (a
sleep, so the loader may use every core) fed by stoker.Loader(num_threads="auto")
starting from one thread, against a sweep of fixed settings.

Reports the step of the tuner's last change, its final threads/prefetch,
the data wait (share of step time) after convergence, and for each fixed
setting its data wait; the best fixed setting is the fewest threads (then
the shallowest prefetch) whose wait is under 2%.

    PYTHONPATH=build/release/python .venv/bin/python bench/autotune.py [--packed demo/packed-40x125]
"""
import argparse
import json
import os
import time

import stoker
import stoker.transforms as T


def run(packed, steps, compute_s, batch, **kw):
    loader = stoker.Loader(packed, batch_size=batch, log_epochs=False,
                           transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)]), **kw)
    waits, threads = [], []
    step = 0
    while step < steps:
        for _ in loader:
            time.sleep(compute_s)
            waits.append(loader.stats()["wait_s"])
            threads.append((loader.stats()["threads"], loader.stats()["prefetch"]))
            step += 1
            if step == steps:
                break
    return loader, waits, threads


def wait_share(waits, first, compute_s):
    n = len(waits) - first
    waited = waits[-1] - waits[first - 1] if first > 0 else waits[-1]
    return waited / (waited + n * compute_s)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--packed", default="demo/packed-40x125")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--compute-ms", type=float, default=25.0)
    parser.add_argument("--max-threads", type=int, default=os.cpu_count())
    parser.add_argument("--json")
    args = parser.parse_args()
    compute = args.compute_ms / 1000
    loader, waits, settings = run(args.packed, args.steps, compute, args.batch, num_threads="auto",
                                  autotune_max_threads=args.max_threads)
    stats = loader.stats()
    last = stats["autotune_last_change_batch"]
    tail = max(last + 20, args.steps - 100)
    result = {"autotune": {"last_change_step": last, "threads": stats["threads"], "prefetch": stats["prefetch"],
                           "wait_share_after": wait_share(waits, min(tail, args.steps - 10), compute),
                           "log": loader.autotune_log()}, "sweep": []}
    del loader
    print("autotune: last change at step %d; %d threads, prefetch %d; data wait afterwards %.1f%%" % (
        last, stats["threads"], stats["prefetch"], 100 * result["autotune"]["wait_share_after"]))
    for line in result["autotune"]["log"]:
        print("  " + line)
    for threads in range(1, args.max_threads + 1):
        for prefetch in (2, 4):
            loader, waits, _ = run(args.packed, 150, compute, args.batch, num_threads=threads, prefetch=prefetch)
            share = wait_share(waits, 50, compute)
            result["sweep"].append({"threads": threads, "prefetch": prefetch, "wait_share": share})
            print("fixed %d threads, prefetch %d: data wait %.1f%%" % (threads, prefetch, 100 * share))
            del loader
    good = [r for r in result["sweep"] if r["wait_share"] < 0.02]
    best = min(good, key=lambda r: (r["threads"], r["prefetch"])) if good else min(result["sweep"],
                                                                                       key=lambda r: r["wait_share"])
    result["best_fixed"] = best
    print("best fixed setting: %d threads, prefetch %d (data wait %.1f%%)" % (best["threads"], best["prefetch"],
                                                                              100 * best["wait_share"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
