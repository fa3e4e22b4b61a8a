#!/usr/bin/env python3
"""stoker.TokenLoader beside its peers on one generated Megatron corpus
(issue 28's measure): Megatron-core's GPTDataset (PyPI megatron-core, the
same .idx/.bin files, under a torch DataLoader) and a DataLoader over a
Hugging Face `datasets` dataset packed with the standard group_texts map.
Each peer runs in its own process, on the same seq_len and global batch 8:

- setup_s: what must happen before the first batch can be asked for
  (Megatron: its sample/shuffle index build; Hugging Face: loading the
  documents into Arrow and packing them); stoker has none beyond opening.
- first_batch_s: from the loader's construction to the first batch in hand
  (setup included).
- sequences/s and tokens/s in steady state (each batch's input_ids
  touched), and private memory then (RssAnon of the process and its
  DataLoader workers: the mapped corpus's pages, which all touch and the
  kernel may drop, left out).

The corpus is bench/token_loader_bench.py's (1B uint16 tokens, documents of
1-4,000 tokens; generated once into --work). Megatron-core 0.9 is imported
without megatron/core/__init__.py, whose distributed half needs a newer torch
than Debian's 1.13; its datasets do not.

    PYTHONPATH=build/release/python PEER_PYTHON=/tmp/peer-venv/bin/python \\
        .venv/bin/python bench/token_peers_bench.py [--work /tmp/token-bench] [--only stoker,megatron,hf] [--json]

PEER_PYTHON: a Python with torch, megatron-core and datasets (a venv from
/usr/bin/python3 with --system-site-packages; pip install --no-deps
megatron-core==0.9.0; pip install datasets).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

COMMON = r'''
import json, os, resource, sys, time
args = json.loads(sys.argv[1])
seq_len, rows_to_read, prefix = args["seq_len"], args["rows"], args["prefix"]

def anon_mib():
    # Private memory (RssAnon) of this process and its children (DataLoader workers) now: the mapped
    # corpus's pages, which every peer touches and the kernel may drop, are left out.
    def anon(pid):
        try:
            for line in open("/proc/%d/status" % pid):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            pass
        return 0
    pids = [os.getpid()]
    for task in os.listdir("/proc/self/task"):
        try:
            pids += [int(p) for p in open("/proc/self/task/%s/children" % task).read().split()]
        except OSError:
            pass
    return sum(anon(p) for p in pids)

memory = 0

def steady(it_factory, warm=20):
    it = it_factory()
    for _ in range(warm):
        next(it)
    start, rows, tokens = time.perf_counter(), 0, 0
    while rows < rows_to_read or time.perf_counter() - start < 3:  # and 3 s at least, for a steady figure
        try:
            batch = next(it)
        except StopIteration:
            it = it_factory()
            continue
        ids = batch["input_ids"] if "input_ids" in batch else batch["tokens"]
        ids.sum()
        tokens += ids.numel()
        rows += ids.shape[0]
    seconds = time.perf_counter() - start
    global memory
    memory = anon_mib()  # while the iterator (and its workers) live
    return rows / seconds, tokens / seconds

def report(setup_s, first_s, sps, tps):
    global memory
    memory = memory or anon_mib()
    print(json.dumps({"setup_s": round(setup_s, 2), "first_batch_s": round(first_s, 2),
                      "sequences_per_s": round(sps, 1), "tokens_per_s": round(tps),
                      "private_mib": round(memory)}))
'''

STOKER = COMMON + r'''
import torch, stoker
t = time.perf_counter()
loader = stoker.TokenLoader(prefix, seq_len=seq_len, global_batch_size=8, seed=2)
first = next(iter(loader))
first_s = time.perf_counter() - t
sps, tps = (0, 0) if args["first_only"] else steady(lambda: iter(loader))
report(0.0, first_s, sps, tps)
'''

MEGATRON = COMMON + r'''
import importlib.util, types
import numpy as np, torch
root = importlib.util.find_spec("megatron").submodule_search_locations[0]
for name, path in (("megatron", root), ("megatron.core", root + "/core")):
    m = types.ModuleType(name); m.__path__ = [path]; sys.modules[name] = m
import megatron.core.parallel_state  # noqa: F401 (breaks an import cycle __init__ would have broken)
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

class Tok:  # what GPTDataset asks of a tokenizer
    eod = 0
    pad = 0
    vocab_size = 50257
    unique_identifiers = {"class": "Tok"}

num_rows = args["num_rows"]
cache = args["cache"]
t = time.perf_counter()
config = GPTDatasetConfig(random_seed=2, sequence_length=seq_len, blend=([prefix], None), split="100,0,0",
                          path_to_cache=cache, tokenizer=Tok(), reset_position_ids=True, reset_attention_mask=False,
                          eod_mask_loss=False, create_attention_mask=False)
train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [num_rows, None, None], lambda: True, config).build()
setup_s = time.perf_counter() - t
make = lambda: iter(torch.utils.data.DataLoader(train, batch_size=8, num_workers=args["workers"],
                                                persistent_workers=False))
it = make()
next(it)
first_s = time.perf_counter() - t
sps, tps = (0, 0) if args["first_only"] else steady(make)
report(setup_s, first_s, sps, tps)
'''

HF = COMMON + r'''
import numpy as np, torch, datasets
datasets.disable_progress_bars()
idx_path, bin_path = prefix + ".idx", prefix + ".bin"
with open(idx_path, "rb") as f:
    head = f.read(34)
n = int(np.frombuffer(head[18:26], dtype=np.int64)[0])
lengths = np.memmap(idx_path, dtype=np.int32, mode="r", offset=34, shape=(n,))
tokens = np.memmap(bin_path, dtype=np.uint16, mode="r")
limit = args["hf_tokens"]
ends = np.cumsum(lengths.astype(np.int64))
n_docs = int(np.searchsorted(ends, limit, side="right")) if limit else n

def documents():
    start = 0
    for d in range(n_docs):
        end = int(ends[d])
        yield {"input_ids": tokens[start:end].astype(np.int32)}
        start = end

def group_texts(examples):  # Hugging Face's run_clm packing
    joined = np.concatenate([np.asarray(x, dtype=np.int32) for x in examples["input_ids"]])
    total = (len(joined) // seq_len) * seq_len
    return {"input_ids": joined[:total].reshape(-1, seq_len).tolist()}

t = time.perf_counter()
features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32"))})
ds = datasets.Dataset.from_generator(documents, features=features, cache_dir=args["cache"])
ds = ds.map(group_texts, batched=True, batch_size=1000, num_proc=args["workers"], features=features)
ds = ds.with_format("torch")
setup_s = time.perf_counter() - t
gen = torch.Generator().manual_seed(2)
make = lambda: iter(torch.utils.data.DataLoader(ds, batch_size=8, shuffle=True, generator=gen,
                                                num_workers=args["workers"]))
it = make()
next(it)
first_s = time.perf_counter() - t
sps, tps = steady(make)
report(setup_s, first_s, sps, tps)
'''


def run(python, code, arguments, env):
    r = subprocess.run([python, "-c", code, json.dumps(arguments)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit("a peer failed:\n" + r.stderr[-3000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default="/tmp/token-bench")
    ap.add_argument("--tokens", type=int, default=1_000_000_000)
    ap.add_argument("--hf-tokens", type=int, default=0,
                    help="Hugging Face: only the documents within the first N tokens (0: all)")
    ap.add_argument("--only", default="stoker,megatron,hf")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers of the peers")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each peer, alternating; the median run (by sequences/s) is reported")
    ap.add_argument("--startup", action=argparse.BooleanOptionalAction, default=True,
                    help="also time the first batch on token_loader_bench.py's 10B-token corpus, when generated")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sys.path.insert(0, HERE)
    import shutil
    import tempfile

    import token_loader_bench
    os.makedirs(args.work, exist_ok=True)
    prefix = token_loader_bench.corpus(args.work, args.tokens)
    with open(prefix + ".bin", "rb") as f:  # page cache warm for everyone
        while f.read(1 << 26):
            pass
    peer_python = os.environ.get("PEER_PYTHON", sys.executable)
    results = []
    # Start-up at scale: token_loader_bench.py's 10-billion-token, 10-million-document corpus (a sparse .bin).
    big = os.path.join(args.work, "startup")
    if args.startup and os.path.exists(big + ".idx"):
        for name in [n for n in args.only.split(",") if n in ("stoker", "megatron")]:
            cache = tempfile.mkdtemp(prefix="peer-cache-", dir=args.work)
            a = {"seq_len": 2048, "rows": 0, "prefix": big, "cache": cache, "workers": args.workers,
                 "num_rows": 10_000_000_000 // 2048, "hf_tokens": 0, "first_only": True}
            r = run(sys.executable if name == "stoker" else peer_python, STOKER if name == "stoker" else MEGATRON, a,
                    os.environ)
            shutil.rmtree(cache, ignore_errors=True)
            r.update(peer=name, seq_len=2048, corpus="10B tokens, 10M documents")
            results.append(r)
            print("%-8s 10B-token corpus: setup %7.2f s, first batch %7.2f s, private memory %5d MiB" % (
                name, r["setup_s"], r["first_batch_s"], r["private_mib"]), flush=True)
    for seq_len, rows in ((2048, 20000), (8192, 5000)):
        runs = {name: [] for name in args.only.split(",")}
        for _ in range(args.repeats):
            for name in runs:
                cache = tempfile.mkdtemp(prefix="peer-cache-", dir=args.work)  # a fresh index build each run
                a = {"seq_len": seq_len, "rows": rows, "prefix": prefix, "cache": cache, "workers": args.workers,
                     "num_rows": 0, "hf_tokens": args.hf_tokens, "first_only": False}
                if name == "stoker":
                    r = run(sys.executable, STOKER, a, os.environ)
                elif name == "megatron":
                    a["num_rows"] = args.tokens // seq_len  # one epoch's samples
                    r = run(peer_python, MEGATRON, a, os.environ)
                elif name == "hf":
                    r = run(peer_python, HF, a, dict(os.environ, HF_DATASETS_CACHE=cache))
                else:
                    raise SystemExit("unknown peer " + name)
                shutil.rmtree(cache, ignore_errors=True)
                runs[name].append(r)
        for name, rs in runs.items():
            rs.sort(key=lambda r: r["sequences_per_s"])
            r = dict(rs[len(rs) // 2], peer=name, seq_len=seq_len,
                     sequences_per_s_runs=[x["sequences_per_s"] for x in rs])
            results.append(r)
            print("%-8s seq_len %5d: setup %7.2f s, first batch %7.2f s, %8.0f sequences/s (runs: %s), %6.3g tokens/s, "
                  "private memory %5d MiB" % (name, seq_len, r["setup_s"], r["first_batch_s"], r["sequences_per_s"],
                                              ", ".join("%.0f" % x for x in r["sequences_per_s_runs"]),
                                              r["tokens_per_s"], r["private_mib"]), flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
