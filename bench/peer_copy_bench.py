"""In-memory copies on peers (Checkpointer(replicate_to_peer=True)), measured.

    python bench/peer_copy_bench.py [--ranks 3] [--size-mib 1024] [--saves 5] [--dir DIR]

Starts --ranks processes on gloo, each holding a state of --size-mib MiB in
all, half replicated and half sharded by rows (as bench/sharded_checkpoint_bench.py).
Each "machine" r keeps its copies in /dev/shm/stoker-peer-bench/machine-r.

  save      alternately with and without replicate_to_peer: the stall of
            save(), the time until the copy is in the peer's memory, and
            the time to durable in storage (each polled every millisecond;
            the median over saves after the first, the slowest rank).
  restore   a new job of --ranks processes whose rank 1 runs on a replacement
            machine (machine 1's memory is lost): load_latest(from_peers=True)
            against load_latest from storage, warm (page cache) and cold
            (after dropping the page cache, where this process may: root);
            best of three, the slowest rank.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sharded_checkpoint_bench import TENSOR_MIB, _free_port, _rows  # noqa: E402

MEMORY = "/dev/shm/stoker-peer-bench"


def _state(rank, world, size_mib):
    import torch
    import stoker
    count = size_mib // 2 // TENSOR_MIB
    cols = 1024
    rows = TENSOR_MIB * (1 << 20) // 4 // cols
    begin, end = _rows(rank, world, rows)
    state = {"model": {"rep%02d" % i: torch.full((rows, cols), float(i)) for i in range(count)}}
    state["model"].update({"shard%02d" % i: stoker.Shard(torch.full((end - begin, cols), float(100 + i)),
                                                         (rows, cols), (begin, 0)) for i in range(count)})
    return state


def _drop_page_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return True
    except OSError:
        return False


def worker(args):
    import torch.distributed as dist
    import stoker
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    out = {"rank": rank}
    state = _state(rank, world, args.size_mib)
    if args.phase == "save":
        plain = stoker.Checkpointer(os.path.join(args.dir, "plain"), keep_last=1)
        copied = stoker.Checkpointer(os.path.join(args.dir, "copied"), keep_last=1, replicate_to_peer=True,
                                     peer_memory_dir=os.path.join(MEMORY, "machine-%d" % rank))
        rows = {"plain": [], "copied": []}
        for step in range(args.saves):
            for name, ckpt in (("plain", plain), ("copied", copied)):
                dist.barrier()
                t0 = time.perf_counter()
                ckpt.save(step, state, rng=False)
                stall = time.perf_counter() - t0
                durable = copy = None
                while durable is None or (copy is None and ckpt._peers is not None):
                    now = time.perf_counter() - t0
                    if durable is None and not ckpt._native.busy():
                        durable = now
                    if copy is None and ckpt._peers is not None and not ckpt._peers.busy():
                        copy = now
                    time.sleep(0.001)
                ckpt.wait()
                rows[name].append({"stall": stall, "durable": durable, "copy": copy})
        out.update(rows)
        out["copy_failures"] = copied.stats()["peer_copy_failures"]
        out["copy_bytes"] = copied.stats()["peer_copy_bytes"]
        plain.close()
        copied.close()
    else:
        directory = os.path.join(args.dir, "copied")
        memory = os.path.join(MEMORY, "machine-%d" % rank)  # rank 1's was removed: a replacement machine
        for key in ("memory", "warm", "cold"):
            out[key] = []
        for _ in range(3):
            for key in ("memory", "warm", "cold"):
                if key == "cold":
                    if rank == 0:
                        out["dropped"] = _drop_page_cache()
                dist.barrier()
                t0 = time.perf_counter()
                loaded = stoker.load_latest(directory, target=state, from_peers=key == "memory", memory_dir=memory)
                out[key].append(time.perf_counter() - t0)
                assert loaded.path.startswith("memory:") == (key == "memory"), loaded.path
                assert state["model"]["shard00"].tensor[0, 0].item() == 100.0
    with open(os.path.join(args.dir, "result-%s-%d.json" % (args.phase, rank)), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


def launch(args, phase):
    port = _free_port()
    procs = []
    for rank in range(args.ranks):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.ranks), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "--phase", phase, "--dir", args.dir,
                                       "--size-mib", str(args.size_mib), "--saves", str(args.saves)], env=env))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("a %s worker failed" % phase)
    return [json.load(open(os.path.join(args.dir, "result-%s-%d.json" % (phase, r)))) for r in range(args.ranks)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--saves", type=int, default=5)
    parser.add_argument("--dir", default="/tmp/stoker-peer-bench")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--phase", default="save")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    for path in (args.dir, MEMORY):
        shutil.rmtree(path, ignore_errors=True)
    os.makedirs(args.dir)
    try:
        saved = launch(args, "save")
        in_memory = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(MEMORY) for f in fs)
        shutil.rmtree(os.path.join(MEMORY, "machine-1"))
        restored = launch(args, "restore")
    finally:
        shutil.rmtree(MEMORY, ignore_errors=True)

    def median(method, key):
        per_save = [max(r[method][i][key] for r in saved) for i in range(args.saves)]
        return statistics.median(per_save[1:])

    report = {"ranks": args.ranks, "size_mib": args.size_mib, "bytes_in_memory": in_memory}
    print("%d ranks on gloo, %d MiB of state (half replicated), %d saves each way (median after the first, slowest "
          "rank)" % (args.ranks, args.size_mib, args.saves))
    print("%-22s %9s %11s %13s" % ("", "stall s", "durable s", "in peer's s"))
    for method in ("plain", "copied"):
        row = {"stall_s": median(method, "stall"), "durable_s": median(method, "durable")}
        if method == "copied":
            row["copy_s"] = median(method, "copy")
        report[method] = row
        print("%-22s %9.3f %11.3f %13s" % ("replicate_to_peer" if method == "copied" else "storage only",
                                           row["stall_s"], row["durable_s"],
                                           "%.3f" % row["copy_s"] if "copy_s" in row else "-"))
    print("in memory: %.0f MiB on all machines (each rank's pieces twice); copy failures: %d"
          % (in_memory / (1 << 20), sum(r["copy_failures"] for r in saved)))
    best = {key: min(max(r[key][i] for r in restored) for i in range(3)) for key in ("memory", "warm", "cold")}
    report["restore"] = best
    report["cold_is_cold"] = bool(restored[0].get("dropped"))
    print("restore of %d ranks, machine 1 replaced: from peers' memory %.3f s; from storage warm %.3f s, cold %.3f s%s"
          % (args.ranks, best["memory"], best["warm"], best["cold"],
             "" if report["cold_is_cold"] else " (page cache NOT dropped: not root)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
