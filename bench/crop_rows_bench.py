#!/usr/bin/env python3
"""Reading only the MCU rows a crop covers (`read_crop_rows`, a seekable pack
indexed as version 7) against reading every JPEG whole, on the same pack
with the ImageNet training transform (RandomResizedCrop(224) +
RandomHorizontalFlip + Normalize, float32, batch 64).

Two cases, each run in a fresh process per mode, alternating, `--repeats`
times:

Each runs a warm-up epoch, then one timed epoch:

- warm: the shards in the page cache (images/s and CPU ms per image in
  steady state).
- cold: the shards' pages evicted from the page cache before the timed epoch
  (posix_fadvise DONTNEED: they come from the disk, as a dataset larger than
  memory does); images/s, and the bytes the process read from storage per
  image (/proc/self/io read_bytes, which counts what the kernel's read-ahead
  fetched too).

Both report the loader's bytes_read per image (what it asked for).

    PYTHONPATH=build/release/python .venv/bin/python bench/crop_rows_bench.py \\
        --data demo/seekable-40x125 [--repeats 3] [--cases warm cold] [--json out.json]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time


def storage_read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def run_one(data, mode, case, threads):
    import stoker
    import stoker.transforms as T
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                           T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])
    loader = stoker.Loader(data, batch_size=64, transform=transform, seed=0, log_epochs=False,
                           read_crop_rows=(mode == "rows"), num_threads=threads)
    # A warm-up epoch (threads, allocations, the libraries' pages), then the timed one.
    for _ in loader:
        pass
    loader.set_epoch(1)
    if case == "cold":
        from readahead_bench import evict  # bench/, this script's folder
        evict(data)
    before = loader.stats()
    disk0 = storage_read_bytes()
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    samples = 0
    for images, _ in loader:
        samples += images.shape[0]
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    disk = storage_read_bytes() - disk0
    after = loader.stats()
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return {"mode": mode, "case": case, "images": samples, "images_per_s": samples / wall,
            "cpu_ms_per_image": 1e3 * cpu / samples,
            "loader_bytes_per_image": (after["bytes_read"] - before["bytes_read"]) / max(
                after["samples_read"] - before["samples_read"], 1),
            "storage_bytes_per_image": disk / samples,
            "part_reads": after["seekable_part_reads"] - before["seekable_part_reads"],
            "part_rereads": after["seekable_part_rereads"] - before["seekable_part_rereads"],
            "seekable_decodes": after["seekable_decodes"] - before["seekable_decodes"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a pack made with stoker pack --seekable-jpeg")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["warm", "cold"], choices=["warm", "cold"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json")
    parser.add_argument("--one", nargs=2, metavar=("MODE", "CASE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.data, args.one[0], args.one[1], args.threads)))
        return
    results = []
    for case in args.cases:
        for repeat in range(args.repeats):
            for mode in ("whole", "rows") if repeat % 2 == 0 else ("rows", "whole"):
                cmd = [sys.executable, __file__, "--data", args.data, "--one", mode, case]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                r = json.loads(out.strip().splitlines()[-1])
                results.append(r)
                print("%-5s %-5s %7.0f img/s  %.3f CPU ms/img  loader %6.1f KB/img  storage %6.1f KB/img  "
                      "(part reads %d, re-read whole %d)" % (case, mode, r["images_per_s"], r["cpu_ms_per_image"],
                                                             r["loader_bytes_per_image"] / 1e3,
                                                             r["storage_bytes_per_image"] / 1e3, r["part_reads"],
                                                             r["part_rereads"]), flush=True)
    print("\nmedians:")
    summary = {}
    for case in args.cases:
        for mode in ("whole", "rows"):
            rs = [r for r in results if r["case"] == case and r["mode"] == mode]
            m = {k: statistics.median(r[k] for r in rs)
                 for k in ("images_per_s", "cpu_ms_per_image", "loader_bytes_per_image", "storage_bytes_per_image")}
            summary["%s/%s" % (case, mode)] = m
            print("%-5s %-5s %7.0f img/s  %.3f CPU ms/img  loader %6.1f KB/img  storage %6.1f KB/img" % (
                case, mode, m["images_per_s"], m["cpu_ms_per_image"], m["loader_bytes_per_image"] / 1e3,
                m["storage_bytes_per_image"] / 1e3))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": results, "medians": summary}, f, indent=1)


if __name__ == "__main__":
    main()
