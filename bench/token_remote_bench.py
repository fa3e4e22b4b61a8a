#!/usr/bin/env python3
"""stoker.TokenLoader over HTTP (issue 28: remote corpora through the shard
cache): nginx serves a generated Megatron corpus (bench/token_loader_bench.py's
shape, --tokens of them) through our proxy, which adds a latency to every
request and caps the bandwidth of all transfers together (a bucket in
another region). seq_len 2048, global batch 8, one process; the consumer
touches each batch. Reported per configuration: time to the first batch,
sequences/s over --rows rows, bytes downloaded / bytes the rows hold
(read amplification) and the cache's hit rate.

- local: the same files on local disk (page cache warm).
- cold, cache >= corpus, read ahead 16 batches / 1 batch: the first pass,
  every chunk downloaded once, in the loader's order or only when needed.
- warm: a second loader on the same cache folder (everything local).
- cache 25% of the corpus, 64 KiB chunks: rows shuffled over the whole
  corpus miss the cache 3 times in 4, so each miss costs a chunk.

    PYTHONPATH=build/release/python .venv/bin/python bench/token_remote_bench.py [--tokens 100000000]
        [--latency-ms 30] [--bandwidth-mb 200] [--json]
"""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
sys.path.insert(0, str(ROOT / "bench"))
import remote_servers  # noqa: E402
import token_loader_bench  # noqa: E402


def run(stoker, prefix, rows_to_read, **kw):
    t = time.perf_counter()
    loader = stoker.TokenLoader(prefix, seq_len=2048, global_batch_size=8, seed=4, **kw)
    it = iter(loader)
    next(it)
    first = time.perf_counter() - t
    start, rows = time.perf_counter(), 0
    while rows < rows_to_read:
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        batch["input_ids"].sum()
        rows += batch["input_ids"].shape[0]
    seconds = time.perf_counter() - start
    stats = loader.remote_stats()[0]
    held = (rows + 8) * 2048 * 2  # the bytes the rows hold (uint16)
    reads = stats["hits"] + stats["misses"]
    return {"first_batch_s": round(first, 2), "sequences_per_s": round(rows / seconds, 1),
            "amplification": round(stats["bytes_downloaded"] / held, 2),
            "hit_rate": round(stats["hits"] / reads, 3) if reads else None, "downloads": stats["downloads"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/token-remote-bench")
    ap.add_argument("--tokens", type=int, default=100_000_000)
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--latency-ms", type=float, default=30)
    ap.add_argument("--bandwidth-mb", type=float, default=200, help="MB/s for all transfers together")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    import stoker
    os.makedirs(args.work, exist_ok=True)
    prefix = token_loader_bench.corpus(args.work, args.tokens)
    corpus_bytes = os.path.getsize(prefix + ".bin")
    nginx = remote_servers.Nginx(args.work)
    proxy = remote_servers.FaultProxy(nginx.url, latency_s=args.latency_ms / 1000,
                                      bandwidth=args.bandwidth_mb * 1e6)
    url = proxy.url + "/corpus"
    results = {"tokens": args.tokens, "corpus_bytes": corpus_bytes, "latency_ms": args.latency_ms,
               "bandwidth_mb": args.bandwidth_mb}
    try:
        results["local"] = run(stoker, prefix, args.rows)
        big = 2 * corpus_bytes
        for ahead in (16, 1):
            cache = tempfile.mkdtemp(dir=args.work, prefix="cache-")
            results["cold_read_ahead_%d" % ahead] = run(stoker, url, args.rows, cache_dir=cache, cache_size=big,
                                                        chunk_size="16MiB", read_ahead_batches=ahead)
            if ahead == 16:
                results["warm"] = run(stoker, url, args.rows, cache_dir=cache, cache_size=big, chunk_size="16MiB")
            shutil.rmtree(cache)
        cache = tempfile.mkdtemp(dir=args.work, prefix="cache-")
        results["cache_25pct_64KiB_chunks"] = run(stoker, url, args.rows // 4, cache_dir=cache,
                                                  cache_size=corpus_bytes // 4, chunk_size="64KiB",
                                                  read_ahead_batches=16, connections=32)
        shutil.rmtree(cache)
    finally:
        proxy.close()
        nginx.close()
    for name, r in results.items():
        if isinstance(r, dict):
            print("%-28s first batch %6.2f s  %9.0f sequences/s  amplification %6.2f  hit rate %s" % (
                name, r["first_batch_s"], r["sequences_per_s"], r["amplification"], r["hit_rate"]), flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
