#!/usr/bin/env python3
"""The kernel's read-ahead on shard files (`stoker bench --kernel-readahead`),
with a page cache smaller than the shards and a slow disk, as a dataset
larger than memory meets them.

Each run is a fresh `stoker bench DATA --epochs E --json` process (ImageNet
training transform, global shuffle, batch 64) inside a cgroup v1 memory
limit (`--memory-mib`: the page cache is charged to it, so it holds at most
that less the process's own memory) and a blkio read limit on the shards'
disk (`--read-mbps`). Before each run the shards' pages are evicted
(posix_fadvise DONTNEED). Modes alternate run by run, `--repeats` times:

- images/s of each epoch after the first (steady state: the cache holds
  what the last epoch left) and of the first;
- bytes read from storage per image over the whole run (the cgroup's
  blkio.throttle.io_service_bytes, which counts what the kernel read ahead);
- the loader's own bytes per image (what it asked for).

With `--url`, the same data is read as a remote dataset (`--data` is the
folder an HTTP server outside the cgroup serves at that URL): each run
starts from an empty `--cache-dir` (on the throttled disk) large enough to
hold it, so epoch 1 downloads, and epochs 2 and 3 read the cache's copies
through the limited page cache.

Needs root and cgroup v1's memory and blkio hierarchies (this project's
machines have them).

    bench/readahead_bench.py --stoker build/release/stoker --data demo/seekable-40x125 \\
        --memory-mib 380 --read-mbps 100 [--epochs 3] [--repeats 3] [--modes on off auto] [--json out.json]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

CGROUP_MEMORY = "/sys/fs/cgroup/memory"
CGROUP_BLKIO = "/sys/fs/cgroup/blkio"
NAME = "stoker-readahead-bench"


def device_of(path):
    st = os.stat(path)
    return "%d:%d" % (os.major(st.st_dev), os.minor(st.st_dev))


def block_device_of(path):
    """major:minor of the whole disk holding `path` (a partition's parent)."""
    dev = device_of(path)
    sys_path = os.path.realpath("/sys/dev/block/" + dev)
    if os.path.exists(os.path.join(sys_path, "partition")):
        with open(os.path.join(os.path.dirname(sys_path), "dev")) as f:
            return f.read().strip()
    return dev


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def setup_cgroups(memory_mib, read_mbps, disk):
    mem, blk = os.path.join(CGROUP_MEMORY, NAME), os.path.join(CGROUP_BLKIO, NAME)
    for d in (mem, blk):
        os.makedirs(d, exist_ok=True)
    write(os.path.join(mem, "memory.limit_in_bytes"), str(memory_mib << 20) if memory_mib else "-1")
    write(os.path.join(blk, "blkio.throttle.read_bps_device"), "%s %d" % (disk, read_mbps * 1000 * 1000))
    return mem, blk


def storage_bytes(blk, disk):
    with open(os.path.join(blk, "blkio.throttle.io_service_bytes")) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0] == disk and parts[1] == "Read":
                return int(parts[2])
    return 0


def evict(data):
    for name in os.listdir(data):
        if name.endswith(".tar"):
            fd = os.open(os.path.join(data, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run_one(args, mode, mem, blk, disk):
    evict(args.data)
    if args.url:
        shutil.rmtree(args.cache_dir, ignore_errors=True)
    write(os.path.join(blk, "blkio.reset_stats"), "1")
    before = storage_bytes(blk, disk)

    def enter():
        write(os.path.join(mem, "cgroup.procs"), str(os.getpid()))
        write(os.path.join(blk, "cgroup.procs"), str(os.getpid()))

    cmd = [args.stoker, "bench", args.url or args.data, "--epochs", str(args.epochs), "--json",
           "--kernel-readahead", mode, "--threads", str(args.threads)]
    if args.url:
        cmd += ["--cache-dir", args.cache_dir, "--cache-size", "64GiB", "--cache-min-free", "0"]
    out = subprocess.run(cmd, preexec_fn=enter, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s failed (%d): %s" % (" ".join(cmd), out.returncode, out.stderr.strip()))
    epochs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    images = sum(e["images"] for e in epochs)
    later = epochs[1:] or epochs
    return {
        "mode": mode,
        "readahead": epochs[0].get("kernel_readahead"),
        "first_epoch_images_per_s": epochs[0]["images_per_s"],
        "later_images_per_s": sum(e["images"] for e in later) / sum(e["wall_s"] for e in later),
        "storage_kb_per_image": (storage_bytes(blk, disk) - before) / images / 1000,
        "loader_kb_per_image": sum(e["mb_per_s"] * e["wall_s"] for e in epochs) * 1000 / images,
        "cpu_ms_per_image": statistics.mean(e["cpu_s_per_image"] for e in later) * 1000,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stoker", default="build/release/stoker")
    p.add_argument("--data", required=True)
    p.add_argument("--memory-mib", type=int, default=380, help="the cgroup's memory limit; 0: none")
    p.add_argument("--read-mbps", type=int, default=100, help="the disk's read limit, MB/s; 0: none")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--modes", nargs="+", default=["on", "off"], choices=["on", "off", "auto"])
    p.add_argument("--url", help="read the data as this remote dataset (served from --data)")
    p.add_argument("--cache-dir", default="/var/tmp/stoker-readahead-bench-cache")
    p.add_argument("--json", help="write every run here")
    args = p.parse_args()
    if os.geteuid() != 0 or not os.path.isdir(CGROUP_MEMORY) or not os.path.isdir(CGROUP_BLKIO):
        sys.exit("needs root and cgroup v1's memory and blkio hierarchies (%s, %s)" % (CGROUP_MEMORY, CGROUP_BLKIO))
    disk = block_device_of(os.path.dirname(os.path.abspath(args.cache_dir)) if args.url else args.data)
    with open("/sys/dev/block/%s/queue/read_ahead_kb" % disk) as f:
        read_ahead_kb = int(f.read())
    shard_bytes = sum(os.path.getsize(os.path.join(args.data, n)) for n in os.listdir(args.data) if n.endswith(".tar"))
    print("shards %.1f MiB on disk %s (read_ahead_kb %d); cgroup memory %s, reads %s; %d epochs, %d repeats"
          % (shard_bytes / 2**20, disk, read_ahead_kb, "%d MiB" % args.memory_mib if args.memory_mib else "unlimited",
             "%d MB/s" % args.read_mbps if args.read_mbps else "unthrottled", args.epochs, args.repeats), flush=True)
    mem, blk = setup_cgroups(args.memory_mib, args.read_mbps, disk)
    runs = []
    for r in range(args.repeats):
        for mode in args.modes:
            run = run_one(args, mode, mem, blk, disk)
            runs.append(run)
            print("  run %d %-4s (read-ahead %s): first epoch %6.0f img/s, later %6.0f img/s, storage %5.1f KB/img, "
                  "loader %5.1f KB/img, %.2f ms CPU/img" % (
                      r, mode, "on" if run["readahead"] else "off", run["first_epoch_images_per_s"],
                      run["later_images_per_s"], run["storage_kb_per_image"], run["loader_kb_per_image"],
                      run["cpu_ms_per_image"]), flush=True)
    print("medians:")
    for mode in args.modes:
        rs = [x for x in runs if x["mode"] == mode]
        med = {k: statistics.median(x[k] for x in rs) for k in rs[0] if k not in ("mode", "readahead")}
        print("  %-4s: first epoch %6.0f img/s, later epochs %6.0f img/s (runs %s), storage %5.1f KB/img, "
              "loader %5.1f KB/img" % (
                  mode, med["first_epoch_images_per_s"], med["later_images_per_s"],
                  "-".join("%.0f" % v for v in sorted((x["later_images_per_s"] for x in rs))[::max(1, len(rs) - 1)]),
                  med["storage_kb_per_image"], med["loader_kb_per_image"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"read_ahead_kb": read_ahead_kb, "memory_mib": args.memory_mib, "read_mbps": args.read_mbps,
                       "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
