"""How close shard-aware orders come to a global shuffle, on a packed
dataset: stoker's shard_block for several windows, and MosaicML Streaming's
shard-aware shuffles (py1s, py1br, py1e with num_canonical_nodes=1) applied
to the same shards, beside a global shuffle. Per batch: distinct labels,
label entropy (bits, and as a share of the global shuffle's), distinct
shards; the mean distance between consecutive samples' positions in the
dataset (as a share of the global shuffle's, about N/3). Averaged over
--epochs epochs.

    PYTHONPATH=build/release/python .venv/bin/python bench/shuffle_quality.py DATASET [--batch-size 64]
    # with Mosaic's shuffles: run it with a Python that has mosaicml-streaming
    PYTHONPATH=build/release/python /var/tmp/mosaic-venv/bin/python bench/shuffle_quality.py DATASET
"""
import argparse
import json

import numpy as np

from stoker import _native
from stoker.order_quality import measure

KEYS = ["labels_per_batch", "label_entropy_bits", "label_entropy_bits_vs_global", "shards_per_batch",
        "mean_jump_vs_global"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dataset")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--windows", default="1,2,4,8,16")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    layout = _native.dataset_layout(args.dataset)
    labels, shard_of = layout["labels"], layout["shard_of_sample"]
    shard_samples = np.asarray(layout["shard_samples"], dtype=np.int64)

    orders = [("global shuffle", lambda e: _native.epoch_order(args.dataset, _native.Order.shuffle, 0, 0, e))]
    for w in map(int, args.windows.split(",")):
        orders.append(("stoker shard_block, window %d" % w,
                       lambda e, w=w: _native.epoch_order(args.dataset, _native.Order.shard_block, w, 0, e)))
    try:
        from streaming.base.shuffle import get_shuffle
        for algo in ("py1s", "py1br", "py1e"):
            orders.append(("Mosaic %s" % algo, lambda e, algo=algo: get_shuffle(algo, shard_samples, 1, 0, e)))
    except ImportError:
        print("(mosaicml-streaming is not importable here: its shuffles are left out)")

    rows = []
    for name, make in orders:
        per_epoch = [measure(make(e), labels, shard_of, args.batch_size, seed=e) for e in range(args.epochs)]
        row = {"order": name, **{k: float(np.mean([m[k] for m in per_epoch])) for k in KEYS}}
        rows.append(row)
    if args.json:
        print(json.dumps(rows))
        return
    print("%d samples in %d shards, %d labels, batches of %d, %d epochs" % (
        len(labels), len(shard_samples), len(np.unique(labels)), args.batch_size, args.epochs))
    print("| order | labels per batch | label entropy (bits) | vs global | shards per batch | jump vs global |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %.1f | %.2f | %.2f | %.1f | %.2f |" % (r["order"], r["labels_per_batch"], r["label_entropy_bits"],
                                                          r["label_entropy_bits_vs_global"], r["shards_per_batch"],
                                                          r["mean_jump_vs_global"]))


if __name__ == "__main__":
    main()
