"""Checkpoint stall and persist throughput: torch.save vs stoker.Checkpointer.

For each state size (float32 tensors of 64 MiB, like a model's parameters and
optimizer moments), in one run on one disk:
  - the disk's sequential write bandwidth: the same number of bytes written
    with large write() calls and an fsync, best of three runs (what any
    writer can hope for);
  - torch.save: how long the training loop is stopped (the whole call), and
    the fsync that makes it durable, timed separately: median of three calls
    each on a clean page cache (its best case), and median of three calls in
    a row, as a training loop makes them;
  - stoker: the stall (save() returning: the snapshot), the persist time until
    the checkpoint is published and durable, and its throughput.
The first stoker save allocates and faults in the snapshot buffers; it is
reported separately, and the steady-state figures are the median of the
following saves.

    PYTHONPATH=build/release/python .venv/bin/python bench/checkpoint_bench.py --sizes 1GiB,4GiB --dir /var/tmp/ckpt-bench
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch

import stoker
from stoker.checkpoint import parse_size


def make_state(total_bytes):
    chunk = 64 << 20
    n = max(1, total_bytes // chunk)
    gen = torch.Generator().manual_seed(0)
    return {"layer%03d.weight" % i: torch.randn(chunk // 4, generator=gen) for i in range(n)}


def drop_page_cache():
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass  # not root: figures then include whatever the cache holds


def sequential_write(path, state):
    """Bytes/s of writing the state's bytes with 64 MiB write()s plus fsync."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        total = 0
        for t in state.values():
            view = memoryview(t.numpy()).cast("B")
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:done + (64 << 20)])
            total += len(view)
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    os.remove(path)
    return total / seconds, seconds


def bench_size(size, directory, saves):
    state = make_state(size)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    out = {"state_bytes": nbytes, "tensors": len(state)}

    # The disk's best showing: the fastest of three runs.
    runs = []
    for _ in range(3):
        drop_page_cache()
        runs.append(sequential_write(os.path.join(directory, "seq.bin"), state))
    bw, seconds = max(runs)
    out["sequential_write_bytes_per_s"] = bw
    out["sequential_write_s"] = seconds
    out["sequential_write_runs_bytes_per_s"] = [r[0] for r in runs]

    # torch.save, median of three, each on a clean page cache (its best case).
    path = os.path.join(directory, "torch.pt")
    torch_runs, syncs = [], []
    for _ in range(3):
        drop_page_cache()
        start = time.perf_counter()
        torch.save(state, path)
        torch_runs.append(time.perf_counter() - start)
        start = time.perf_counter()
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        syncs.append(time.perf_counter() - start)
        os.remove(path)
    out["torch_save_clean_cache_s"] = statistics.median(torch_runs)
    out["torch_save_fsync_s"] = statistics.median(syncs)
    out["torch_save_clean_cache_runs_s"] = torch_runs
    # torch.save as a training loop calls it: one save after another, the
    # page cache holding the previous ones' pages (symmetric with stoker's
    # steady state below).
    drop_page_cache()
    loop_runs = []
    for i in range(3):
        start = time.perf_counter()
        torch.save(state, os.path.join(directory, "torch-%d.pt" % i))
        loop_runs.append(time.perf_counter() - start)
    for i in range(3):
        os.remove(os.path.join(directory, "torch-%d.pt" % i))
    out["torch_save_in_loop_s"] = statistics.median(loop_runs)
    out["torch_save_in_loop_runs_s"] = loop_runs

    drop_page_cache()
    stalls, persists = [], []
    with stoker.Checkpointer(os.path.join(directory, "stoker"), keep_last=1) as ckpt:
        for i in range(saves + 1):
            start = time.perf_counter()
            ckpt.save(i, state, rng=False)
            stall = time.perf_counter() - start
            # Training would go on here; the bench waits so that each save is
            # measured alone.
            ckpt.wait()
            s = ckpt.stats()
            if i == 0:
                out["stoker_first_stall_s"] = stall
                out["stoker_first_persist_s"] = s["last_persist_s"]
            else:
                stalls.append(stall)
                persists.append(s["last_persist_s"])
        out["stoker_pinned"] = s["pinned_snapshot"]
    out["stoker_stall_s"] = statistics.median(stalls)
    out["stoker_persist_s"] = statistics.median(persists)
    out["stoker_persist_bytes_per_s"] = nbytes / out["stoker_persist_s"]
    out["stall_vs_torch_save_clean_cache"] = out["stoker_stall_s"] / out["torch_save_clean_cache_s"]
    out["stall_vs_torch_save_in_loop"] = out["stoker_stall_s"] / out["torch_save_in_loop_s"]
    out["persist_vs_sequential"] = out["stoker_persist_bytes_per_s"] / bw
    shutil.rmtree(directory, ignore_errors=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1GiB,4GiB")
    parser.add_argument("--dir", default="/var/tmp/stoker-checkpoint-bench")
    parser.add_argument("--saves", type=int, default=5, help="steady-state saves per size (after the first)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for size in args.sizes.split(","):
        r = bench_size(parse_size(size), args.dir, args.saves)
        r["size"] = size
        results.append(r)
        gb = 1e9
        print("%-5s  disk seq write %.2f GB/s | torch.save stall %.2f s on a clean page cache (+%.2f s fsync), "
              "%.2f s in a loop | stoker stall %.3f s (first %.3f s) = %.1f%% / %.1f%% of torch.save's | "
              "persist %.2f s = %.2f GB/s = %.0f%% of seq write"
              % (size, r["sequential_write_bytes_per_s"] / gb, r["torch_save_clean_cache_s"], r["torch_save_fsync_s"],
                 r["torch_save_in_loop_s"], r["stoker_stall_s"], r["stoker_first_stall_s"],
                 100 * r["stall_vs_torch_save_clean_cache"], 100 * r["stall_vs_torch_save_in_loop"],
                 r["stoker_persist_s"], r["stoker_persist_bytes_per_s"] / gb, 100 * r["persist_vs_sequential"]),
              flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
