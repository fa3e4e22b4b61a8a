"""The loader over a remote copy of a dataset vs the same dataset on local
disk, in one run: nginx serves the packed shards through our proxy, which
adds a latency to every request and caps the bandwidth of all transfers
together (a storage bucket in another region), and the cache holds a fraction
of the dataset. The servers run on this machine at a higher priority than
the loader (root only): they still take CPU time from it, which a real
remote store would not. Reports per epoch: images/s (remote and local), bytes
downloaded / dataset size (read amplification) and the cache hit rate.

    PYTHONPATH=build/release/python .venv/bin/python bench/remote_bench.py \
        --images demo/images-40x125 --latency-ms 30 --bandwidth-mb 100 --cache-fraction 0.25 --epochs 3
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
import remote_servers  # noqa: E402


def bench(stoker, location, args, extra):
    cmd = [stoker, "bench", location, "--epochs", str(args.epochs), "--json", "--order", "shard-block",
           "--batch-size", str(args.batch_size), *(["--threads", str(args.threads)] if args.threads else []), *extra]
    def start():
        # The loader runs at normal priority; the servers (this process and nginx) above it.
        os.nice(-os.nice(0))
        if args.loader_cpus:
            os.sched_setaffinity(0, args.loader_cpus)

    out = subprocess.run(cmd, check=True, capture_output=True, text=True, preexec_fn=start).stdout
    return [json.loads(line) for line in out.strip().splitlines()]


def cpu_list(text):
    cpus = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default=str(ROOT / "demo" / "images-40x125"), help="ImageFolder tree to pack")
    p.add_argument("--stoker", default=str(ROOT / "build" / "release" / "stoker"))
    p.add_argument("--shard-size", default="8MiB")
    p.add_argument("--latency-ms", type=float, default=30)
    p.add_argument("--bandwidth-mb", type=float, default=100, help="MB/s for all transfers together")
    p.add_argument("--cache-fraction", type=float, default=0.25)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--threads", type=int, help="the loader's threads (default: one per core)")
    p.add_argument("--loader-cpus", type=cpu_list, help="CPUs for the loader, e.g. 0 or 0-3 (default: all)")
    p.add_argument("--server-cpus", type=cpu_list,
                   help="CPUs for the servers (this process, nginx), so that they do not share the loader's")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="stoker-remote-bench-"))
    try:
        packed = work / "packed"
        subprocess.run([args.stoker, "pack", args.images, str(packed), "--shard-size", args.shard_size], check=True,
                       capture_output=True)
        shards = sorted(packed.glob("*.tar"))
        dataset_bytes = sum(s.stat().st_size for s in shards)
        cache_bytes = int(dataset_bytes * args.cache_fraction)
        print("dataset: %d shards, %.1f MB; cache %.1f MB (%.0f%%); remote: %.0f ms per request, %.0f MB/s"
              % (len(shards), dataset_bytes / 1e6, cache_bytes / 1e6, 100 * args.cache_fraction, args.latency_ms,
                 args.bandwidth_mb), flush=True)
        # The servers stand in for machines in another region: they should not
        # queue behind the loader for this machine's cores (they still use them).
        try:
            os.nice(-10)
        except PermissionError:
            print("note: not root, the servers share the CPU at the loader's priority", flush=True)
        if args.server_cpus:
            os.sched_setaffinity(0, args.server_cpus)  # the proxy's threads, and nginx started below
        nginx = remote_servers.Nginx(packed)
        proxy = remote_servers.FaultProxy(nginx.url, latency_s=args.latency_ms / 1000,
                                          bandwidth=args.bandwidth_mb * 1e6)
        try:
            subprocess.run(["sync"], check=False)
            # Local before and after the remote run: this machine's speed drifts,
            # so the reference is their mean.
            before = bench(args.stoker, str(packed), args, [])
            remote = bench(args.stoker, proxy.url, args,
                           ["--cache-dir", str(work / "cache"), "--cache-size", str(cache_bytes),
                            "--connections", str(args.connections)])
            after = bench(args.stoker, str(packed), args, [])
            local = [dict(b, images_per_s=(b["images_per_s"] + a["images_per_s"]) / 2, before=b["images_per_s"],
                          after=a["images_per_s"]) for b, a in zip(before, after)]
            # The local run again while curl pulls the shards through the same
            # servers at the same cap: what the servers' CPU costs the loader here.
            loaded = None
            if shutil.which("curl"):
                urls = ["%s/%s" % (proxy.url, s.name) for s in shards]
                stop = threading.Event()

                def pull():
                    while not stop.is_set():
                        subprocess.run(["curl", "-s", "--parallel", "--parallel-max", str(args.connections),
                                        *[x for u in urls for x in ("-o", "/dev/null", u)]], check=False,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

                puller = threading.Thread(target=pull, daemon=True)
                puller.start()
                try:
                    loaded = bench(args.stoker, str(packed), args, [])
                finally:
                    stop.set()
                    puller.join()
        finally:
            proxy.close()
            nginx.close()
        rows = []
        print("%5s %12s %12s %8s %14s %10s %22s" % ("epoch", "local img/s", "remote img/s", "ratio", "amplification",
                                                  "hit rate", "local, servers busy"))
        for k, (l, r) in enumerate(zip(local, remote)):
            row = {"epoch": l["epoch"], "local_images_per_s": l["images_per_s"],
                   "local_before_after": [l["before"], l["after"]],
                   "remote_images_per_s": r["images_per_s"], "ratio": r["images_per_s"] / l["images_per_s"],
                   "read_amplification": r["read_amplification"], "cache_hit_rate": r["cache_hit_rate"],
                   "cache_wait_s": r["cache_wait_s"], "bytes_downloaded": r["bytes_downloaded"],
                   "local_servers_busy_images_per_s": loaded[k]["images_per_s"] if loaded else None}
            rows.append(row)
            print("%5d %12.0f %12.0f %7.0f%% %13.2fx %9.1f%% %22s" % (
                row["epoch"], row["local_images_per_s"], row["remote_images_per_s"], 100 * row["ratio"],
                row["read_amplification"], 100 * row["cache_hit_rate"],
                "%.0f" % row["local_servers_busy_images_per_s"] if loaded else "n/a"), flush=True)
        total = sum(r["bytes_downloaded"] for r in rows) / (dataset_bytes * len(rows))
        print("downloaded over %d epochs: %.2fx the dataset per epoch" % (len(rows), total))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"dataset_bytes": dataset_bytes, "cache_bytes": cache_bytes, "shards": len(shards),
                           "latency_ms": args.latency_ms, "bandwidth_mb_per_s": args.bandwidth_mb, "epochs": rows},
                          f, indent=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
