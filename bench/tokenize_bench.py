#!/usr/bin/env python3
"""stoker.tokenize beside Hugging Face tokenizers' own encode_batch (issue
28's goal: within 10%). The corpus: the Python standard library's sources
(real text and code), one document per file, repeated to --documents; a BPE
tokenizer of 32,000 tokens trained on them. encode_batch alone gets the
texts already in memory; stoker.tokenize reads them from a JSON Lines file
and writes the Megatron dataset. Best of --repeats each, alternating.

    PYTHONPATH=build/release/python .venv/bin/python bench/tokenize_bench.py [--documents 4000]
"""
import argparse
import glob
import json
import os
import sys
import tempfile
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--documents", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default=tempfile.gettempdir() + "/tokenize-bench")
    args = ap.parse_args()
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    import stoker
    os.makedirs(args.work, exist_ok=True)
    files = sorted(glob.glob(os.path.join(os.path.dirname(os.__file__), "**", "*.py"), recursive=True))
    sources = [open(f, encoding="utf-8", errors="replace").read() for f in files]
    sources = [s for s in sources if s.strip()]
    docs = (sources * (args.documents // len(sources) + 1))[:args.documents]
    tok_path = os.path.join(args.work, "tokenizer.json")
    if not os.path.exists(tok_path):
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel()
        tok.train_from_iterator(sources, trainers.BpeTrainer(vocab_size=32000,
                                                             special_tokens=["<unk>", "<|endoftext|>"]))
        tok.save(tok_path)
    tok = Tokenizer.from_file(tok_path)
    jsonl = os.path.join(args.work, "docs.jsonl")
    with open(jsonl, "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    mb = sum(len(d.encode()) for d in docs) / 1e6

    def alone():
        t = time.perf_counter()
        n = 0
        for i in range(0, len(docs), 1024):
            n += sum(len(e.ids) for e in tok.encode_batch(docs[i:i + 1024], add_special_tokens=False))
        return time.perf_counter() - t, n

    def ours():
        t = time.perf_counter()
        r = stoker.tokenize(jsonl, os.path.join(args.work, "out"), tok_path, overwrite=True, progress=False)
        return time.perf_counter() - t, r["tokens"]

    best = {"encode_batch": None, "stoker.tokenize": None}
    for _ in range(args.repeats):
        for name, fn in (("encode_batch", alone), ("stoker.tokenize", ours)):
            seconds, tokens = fn()
            if best[name] is None or seconds < best[name][0]:
                best[name] = (seconds, tokens)
    for name, (seconds, tokens) in best.items():
        print("%-16s %6.2f s  %8.0f documents/s  %6.2f M tokens/s  %5.1f MB/s of text" % (
            name, seconds, len(docs) / seconds, tokens / seconds / 1e6, mb / seconds))
    print("stoker.tokenize takes %.0f%% of encode_batch's time (with reading the JSON Lines and writing the dataset)"
          % (100 * best["stoker.tokenize"][0] / best["encode_batch"][0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
