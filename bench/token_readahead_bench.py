#!/usr/bin/env python3
"""stoker.TokenLoader over a Megatron corpus larger than the page cache can
hold, with the kernel's read-ahead on the mapped .bin (`kernel_readahead="on"`)
and off (`"off"`: madvise MADV_RANDOM), beside Megatron-core's GPTDataset
(its np.memmap, under a torch DataLoader) on the same files.

Each run is a fresh process inside a cgroup v1 memory limit (`--memory-mib`;
the page cache is charged to it) and a blkio read limit on the corpus's disk
(`--read-mbps`), started with the corpus's pages evicted. It takes 20
batches to warm up, then reads for `--seconds`: sequences/s (seq_len 2048,
global batch 8, shuffled, each batch's input_ids touched) and the bytes the
cgroup read from storage per sequence (blkio; what the kernel read around a
page fault included). Modes alternate run by run, `--repeats` times.

The corpus is bench/token_loader_bench.py's (1B uint16 tokens, 2 GB,
documents of 1-4,000 tokens), generated once into --work.

    PYTHONPATH=build/release/python bench/token_readahead_bench.py --python .venv/bin/python \\
        [--peer-python /tmp/peer-venv/bin/python] [--memory-mib 1024] [--read-mbps 100] [--repeats 3] [--json out]

--peer-python: a Python with torch and megatron-core (bench/token_peers_bench.py says how to make one);
without it the Megatron column is left out.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from readahead_bench import CGROUP_BLKIO, CGROUP_MEMORY, block_device_of, setup_cgroups, storage_bytes, write  # noqa: E402
from token_loader_bench import corpus  # noqa: E402
from token_peers_bench import MEGATRON  # noqa: E402

TIMED = r'''
import json, sys, time
args = json.loads(sys.argv[1])
warm_rows = 0
def timed(batches):
    it = batches()
    global warm_rows
    for _ in range(20):
        batch = next(it)
        warm_rows += (batch["input_ids"] if "input_ids" in batch else batch["tokens"]).shape[0]
    start, rows = time.perf_counter(), 0
    while time.perf_counter() - start < args["seconds"]:
        try:
            batch = next(it)
        except StopIteration:
            it = batches()
            continue
        ids = batch["input_ids"] if "input_ids" in batch else batch["tokens"]
        ids.sum()
        rows += ids.shape[0]
    return rows, time.perf_counter() - start
'''

STOKER = TIMED + r'''
import stoker
loader = stoker.TokenLoader(args["prefix"], seq_len=2048, global_batch_size=8, seed=2,
                            kernel_readahead=args["mode"])
rows, seconds = timed(lambda: iter(loader))
print(json.dumps({"rows": rows, "warm_rows": warm_rows, "seconds": seconds,
                  "kernel_readahead": loader._native.kernel_readahead, "note": loader.readahead_note}))
'''


def megatron_code():
    # token_peers_bench's Megatron setup, timed here instead of reported there.
    setup = MEGATRON.split("t = time.perf_counter()\nconfig")[0].split("args = json.loads(sys.argv[1])")[1]
    return TIMED + setup + r'''
num_rows = args["num_rows"]
config = GPTDatasetConfig(random_seed=2, sequence_length=2048, blend=([args["prefix"]], None), split="100,0,0",
                          path_to_cache=args["cache"], tokenizer=Tok(), reset_position_ids=True,
                          reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False)
train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_rows, None, None], lambda: True, config).build()
rows, seconds = timed(lambda: iter(torch.utils.data.DataLoader(train, batch_size=8, num_workers=2)))
print(json.dumps({"rows": rows, "warm_rows": warm_rows, "seconds": seconds, "kernel_readahead": True}))
'''


def evict(prefix):
    fd = os.open(prefix + ".bin", os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def run_one(args, mode, prefix, mem, blk, disk):
    evict(prefix)
    write(os.path.join(blk, "blkio.reset_stats"), "1")
    before = storage_bytes(blk, disk)

    def enter():
        write(os.path.join(mem, "cgroup.procs"), str(os.getpid()))
        write(os.path.join(blk, "cgroup.procs"), str(os.getpid()))

    if mode == "megatron":
        python, code = args.peer_python, megatron_code()
        extra = {"num_rows": 200000, "cache": os.path.join(args.work, "megatron-cache"), "seq_len": 2048, "rows": 0}
    else:
        python, code, extra = args.python, STOKER, {}
    arguments = json.dumps(dict({"prefix": prefix, "mode": mode, "seconds": args.seconds}, **extra))
    out = subprocess.run([python, "-c", code, arguments], preexec_fn=enter, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("%s run failed (%d): %s" % (mode, out.returncode, out.stderr.strip()[-3000:]))
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return {"mode": mode, "readahead": result["kernel_readahead"],
            "sequences_per_s": result["rows"] / result["seconds"],
            "storage_kb_per_sequence": (storage_bytes(blk, disk) - before) / (result["rows"] + result["warm_rows"]) / 1000,
            "note": result.get("note", "")}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="a Python that imports stoker and torch")
    p.add_argument("--peer-python", help="a Python with megatron-core (adds its column)")
    p.add_argument("--work", default="/var/tmp/token-readahead-bench")
    p.add_argument("--tokens", type=int, default=1_000_000_000)
    p.add_argument("--memory-mib", type=int, default=1024)
    p.add_argument("--read-mbps", type=int, default=100)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["on", "off"], choices=["on", "off", "auto"])
    p.add_argument("--json", help="write every run here")
    args = p.parse_args()
    if os.geteuid() != 0 or not os.path.isdir(CGROUP_MEMORY) or not os.path.isdir(CGROUP_BLKIO):
        sys.exit("needs root and cgroup v1's memory and blkio hierarchies (%s, %s)" % (CGROUP_MEMORY, CGROUP_BLKIO))
    os.makedirs(args.work, exist_ok=True)
    prefix = corpus(args.work, args.tokens)
    disk = block_device_of(args.work)
    mem, blk = setup_cgroups(args.memory_mib, args.read_mbps, disk)
    modes = args.modes + (["megatron"] if args.peer_python else [])
    print("corpus %.2f GB; cgroup memory %d MiB, reads %s" % (
        os.path.getsize(prefix + ".bin") / 1e9, args.memory_mib,
        "%d MB/s" % args.read_mbps if args.read_mbps else "unthrottled"), flush=True)
    runs = []
    for r in range(args.repeats):
        for mode in modes:
            run = run_one(args, mode, prefix, mem, blk, disk)
            runs.append(run)
            print("  run %d %-8s (read-ahead %s): %7.1f sequences/s, %6.1f KB from storage a sequence" % (
                r, mode, "on" if run["readahead"] else "off", run["sequences_per_s"],
                run["storage_kb_per_sequence"]), flush=True)
            if mode == "auto":
                print("    " + run["note"], flush=True)
    print("medians:")
    for mode in modes:
        rs = [x for x in runs if x["mode"] == mode]
        print("  %-8s: %7.1f sequences/s (runs %.1f-%.1f), %6.1f KB from storage a sequence" % (
            mode, statistics.median(x["sequences_per_s"] for x in rs), min(x["sequences_per_s"] for x in rs),
            max(x["sequences_per_s"] for x in rs), statistics.median(x["storage_kb_per_sequence"] for x in rs)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memory_mib": args.memory_mib, "read_mbps": args.read_mbps, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
