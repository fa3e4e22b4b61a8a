#!/usr/bin/env python3
"""stoker.TokenLoader with device="cuda" (part "tokens" of scripts/gpu-check).

On a generated Megatron corpus (bench/token_loader_bench.py's shape: uint16
tokens, documents of 1-4,000 tokens; --tokens of them): the loader with
device="cuda" against the same loader on the CPU, batch by batch in one
order, --compare batches: input_ids, labels, position_ids and cu_seqlens
must arrive on the GPU with the CPU batch's values. Then steady-state
sequences/s and tokens/s onto the GPU at seq_len 2048 and 8192 (global
batch 8), with a consumer that touches each batch on the GPU, and the share
of next() spent waiting.

    PYTHONPATH=build/gpu/python python3 bench/tokens_gpu_check.py --json OUT.json
    PYTHONPATH=build/release/python .venv/bin/python bench/tokens_gpu_check.py --dry-run   # CPU twice
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

KEYS = ("input_ids", "labels", "position_ids", "cu_seqlens")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200_000_000)
    ap.add_argument("--compare", type=int, default=300, help="batches compared at each seq_len")
    ap.add_argument("--rows", type=int, default=20000, help="rows read in steady state at seq_len 2048 (8192: a quarter)")
    ap.add_argument("--work", default="/tmp/tokens-gpu-check")
    ap.add_argument("--json")
    ap.add_argument("--dry-run", action="store_true", help="the CPU in place of the GPU: checks the plumbing")
    args = ap.parse_args()
    import torch

    import stoker
    import token_loader_bench
    os.makedirs(args.work, exist_ok=True)
    prefix = token_loader_bench.corpus(args.work, args.tokens)
    device = "cpu" if args.dry_run else "cuda"
    result = {"device": device, "tokens": args.tokens, "batches_compared": 0, "mismatches": [], "steady": []}

    def loader(seq_len, on):
        return stoker.TokenLoader(prefix, seq_len=seq_len, global_batch_size=8, seed=3, device=on)

    for seq_len in (2048, 8192):
        cpu, gpu = loader(seq_len, "cpu"), loader(seq_len, device)
        if not args.dry_run and gpu.device == "cpu":
            raise SystemExit("device='cuda' fell back to the CPU: no usable GPU")
        for i, (a, b) in enumerate(zip(cpu, gpu)):
            if i == args.compare:
                break
            for k in KEYS:
                if b[k].device.type != device or not torch.equal(a[k], b[k].cpu()):
                    result["mismatches"].append("seq_len %d, batch %d: %s differs or is not on %s" % (seq_len, i, k,
                                                                                                      device))
            result["batches_compared"] += 1

        rows_to_read = args.rows if seq_len == 2048 else args.rows // 4
        steady_loader = loader(seq_len, device)
        it = iter(steady_loader)
        for _ in range(20):  # warm-up
            next(it)
        start, rows, waited = time.perf_counter(), 0, 0.0
        while rows < rows_to_read:
            asked = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:  # the next epoch
                it = iter(steady_loader)
                continue
            finally:
                waited += time.perf_counter() - asked
            (batch["input_ids"].sum() + batch["position_ids"].sum()).item()  # the consumer touches it on the device
            rows += batch["input_ids"].shape[0]
        seconds = time.perf_counter() - start
        result["steady"].append({"seq_len": seq_len, "sequences_per_s": round(rows / seconds, 1),
                                 "tokens_per_s": round(rows * seq_len / seconds), "wait_share": round(waited / seconds,
                                                                                                       3)})
    result["mismatches"] = result["mismatches"][:20]
    result["ok"] = not result["mismatches"] and result["batches_compared"] == 2 * args.compare
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
