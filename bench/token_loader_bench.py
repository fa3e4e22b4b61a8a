#!/usr/bin/env python3
"""stoker.TokenLoader on generated Megatron corpora (issue 28's measure, the
parts that need no peer):

1. Start-up at corpus scale: a 10-billion-token, 10-million-document corpus
   (the .idx written in full with NumPy, the .bin a sparse file of the right
   size): time to open it and yield the first batch, and the process's
   resident memory then.
2. Steady state on a 1-billion-token corpus (uint16, random tokens, documents
   of 1-4,000 tokens): sequences/s and tokens/s at seq_len 2048 and 8192,
   global batch 8, one process, after a warm-up pass over the file (page
   cache warm), each batch's tensors touched.

    PYTHONPATH=build/release/python .venv/bin/python bench/token_loader_bench.py [--work /tmp/token-bench]
        [--startup-documents 10000000] [--startup-tokens 10000000000] [--tokens 1000000000] [--json]
"""
import argparse
import json
import os
import resource
import struct
import subprocess
import sys
import time

import numpy as np

STARTUP = r'''
import sys, time, resource
t = time.perf_counter()
import torch, stoker
t_import = time.perf_counter() - t
t = time.perf_counter()
loader = stoker.TokenLoader(sys.argv[1], seq_len=int(sys.argv[2]), global_batch_size=8, seed=1)
t_open = time.perf_counter() - t
batch = next(iter(loader))
t_first = time.perf_counter() - t
print(t_import, t_open, t_first, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, loader.num_rows)
'''


def write_index(prefix, lengths, dtype_code=8, itemsize=2):
    """A Megatron .idx for documents of `lengths` tokens, written as Megatron-core's builder writes it."""
    n = len(lengths)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", dtype_code))
        f.write(struct.pack("<Q", n) + struct.pack("<Q", n + 1))
        f.write(lengths.astype(np.int32).tobytes())
        pointers = np.zeros(n, dtype=np.int64)
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
        f.write(pointers.tobytes())
        f.write(np.arange(n + 1, dtype=np.int64).tobytes())
    return int(lengths.astype(np.int64).sum())


def startup(work, documents, tokens, seq_len):
    prefix = os.path.join(work, "startup")
    if not os.path.exists(prefix + ".idx"):
        rng = np.random.default_rng(0)
        lengths = rng.integers(1, 2 * tokens // documents - 2, documents)  # a mean just under tokens/documents
        short = tokens - int(lengths.astype(np.int64).sum())
        assert 0 <= short < 2**31 - int(lengths[-1])
        lengths[-1] += short  # exactly `tokens` tokens
        total = write_index(prefix, lengths)
        with open(prefix + ".bin", "wb") as f:
            f.truncate(total * 2)  # sparse: start-up reads no token
    env = dict(os.environ)
    out = subprocess.run([sys.executable, "-c", STARTUP, prefix, str(seq_len)], capture_output=True, text=True,
                         env=env, check=True).stdout.split()
    t_import, t_open, t_first, rss, rows = out
    return {"documents": documents, "tokens": tokens, "seq_len": seq_len, "open_s": round(float(t_open), 3),
            "first_batch_s": round(float(t_first), 3), "import_s": round(float(t_import), 2),
            "max_rss_mib": round(int(rss) / 2**20), "rows": int(rows)}


def corpus(work, tokens):
    prefix = os.path.join(work, "corpus")
    if not os.path.exists(prefix + ".idx"):
        rng = np.random.default_rng(1)
        lengths = rng.integers(1, 4000, tokens // 2000 + 1)
        lengths = lengths[np.cumsum(lengths) <= tokens]
        total = write_index(prefix, lengths)
        with open(prefix + ".bin", "wb") as f:
            left = total
            while left:
                n = min(left, 1 << 26)
                f.write(rng.integers(0, 50257, n, dtype=np.uint16).tobytes())
                left -= n
    return prefix


def steady(prefix, seq_len, rows_to_read):
    import stoker
    loader = stoker.TokenLoader(prefix, seq_len=seq_len, global_batch_size=8, seed=2)
    it = iter(loader)
    for _ in range(20):  # warm-up
        next(it)
    start, rows, tokens = time.perf_counter(), 0, 0
    while rows < rows_to_read:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        batch["input_ids"].sum()  # the consumer touches every token
        tokens += batch["input_ids"].numel()
        rows += batch["input_ids"].shape[0]
    seconds = time.perf_counter() - start
    return {"seq_len": seq_len, "sequences_per_s": round(rows / seconds, 1), "tokens_per_s": round(tokens / seconds)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/token-bench")
    ap.add_argument("--startup-documents", type=int, default=10_000_000)
    ap.add_argument("--startup-tokens", type=int, default=10_000_000_000)
    ap.add_argument("--tokens", type=int, default=1_000_000_000)
    ap.add_argument("--rows", type=int, default=20000, help="rows read in steady state per seq_len")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    results = {"startup": startup(args.work, args.startup_documents, args.startup_tokens, 2048)}
    print("start-up:", results["startup"], flush=True)
    prefix = corpus(args.work, args.tokens)
    with open(prefix + ".bin", "rb") as f:  # page cache warm, as a second epoch finds it
        while f.read(1 << 26):
            pass
    results["steady"] = [steady(prefix, n, args.rows) for n in (2048, 8192)]
    for r in results["steady"]:
        print("seq_len %d: %.0f sequences/s, %.3g tokens/s" % (r["seq_len"], r["sequences_per_s"], r["tokens_per_s"]),
              flush=True)
    results["max_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
