"""Merging datasets written by parallel workers, side by side: `stoker merge`
against Mosaic Streaming's `merge_index`, and against re-indexing every
shard with `stoker index` (what stoker users had before `merge`).

Each of --parts workers writes its share of --samples samples (a label and a
short caption: the payload's size does not matter to a merge, which reads
indexes only) into DATA/part-NNNNN, with stoker.DatasetWriter and with
Mosaic's MDSWriter, two workers at a time; then one merge of each is timed
(median of --repeats). stoker's merge also checks what Mosaic's does not:
every key unique across parts, class names alike, the parts' index checksums.
`stoker index` over the same shards reads every shard byte, so on real
datasets (ImageNet: 140 GB) it costs a full read where a merge reads ~100 MB.

    PYTHONPATH=build/release/python /tmp/peer-venv/bin/python bench/merge_compare.py \
        [--parts 32] [--samples 1281167] [--repeats 3] [--work /tmp/merge-bench]
"""
import argparse
import multiprocessing
import os
import shutil
import statistics
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
STOKER_BIN = os.environ.get("STOKER_BIN", os.path.join(ROOT, "build", "release", "stoker"))


def write_stoker(args):
    out, worker, workers, samples = args
    import stoker
    with stoker.DatasetWriter(out, shard_size="4MiB", class_names=["c%d" % i for i in range(1000)]) as w:
        for j in range(worker, samples, workers):
            w.write({"__key__": "%08d" % j, "cls": j % 1000, "txt": "caption of sample %d" % j})


def write_mds(args):
    out, worker, workers, samples = args
    from streaming import MDSWriter
    with MDSWriter(out=out, columns={"cls": "int", "txt": "str"}, size_limit=4 << 20) as w:
        for j in range(worker, samples, workers):
            w.write({"cls": j % 1000, "txt": "caption of sample %d" % j})


def timed(fn, repeats, before=lambda: None):
    times = []
    for _ in range(repeats):
        before()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=1281167)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work", default="/tmp/merge-bench")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    stoker_root, mds_root = os.path.join(args.work, "stoker"), os.path.join(args.work, "mds")
    parts = [os.path.join(stoker_root, "part-%05d" % i) for i in range(args.parts)]
    jobs = [(parts[i], i, args.parts, args.samples) for i in range(args.parts)]
    mds_jobs = [(os.path.join(mds_root, "part-%05d" % i), i, args.parts, args.samples) for i in range(args.parts)]
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        start = time.perf_counter()
        pool.map(write_stoker, jobs)
        print("written with stoker.DatasetWriter: %d samples in %d parts, %.1f s" %
              (args.samples, args.parts, time.perf_counter() - start))
        start = time.perf_counter()
        pool.map(write_mds, mds_jobs)
        print("written with MDSWriter: %.1f s" % (time.perf_counter() - start))

    index_bytes = sum(os.path.getsize(os.path.join(p, "index.stoker")) for p in parts)
    shards = sum(len([f for f in os.listdir(p) if f.endswith(".tar")]) for p in parts)
    shard_bytes = sum(os.path.getsize(os.path.join(p, f)) for p in parts for f in os.listdir(p) if f.endswith(".tar"))

    peak_kib = []

    def stoker_merge():
        run = subprocess.run(["/usr/bin/time", "-f", "%M", STOKER_BIN, "merge", "--force", stoker_root] + parts,
                             check=True, capture_output=True, text=True)
        peak_kib.append(int(run.stderr.strip().splitlines()[-1]))

    def stoker_reindex():
        subprocess.run([STOKER_BIN, "index", "--force", "-o", os.path.join(args.work, "reindexed.stoker")] + parts,
                       check=True, capture_output=True)

    def mds_merge():
        from streaming.base.util import merge_index
        merge_index(mds_root, keep_local=True)

    merge_s = timed(stoker_merge, args.repeats)
    peak = max(peak_kib) / 1024
    reindex_s = timed(stoker_reindex, args.repeats)
    mds_index = os.path.join(mds_root, "index.json")
    mds_s = timed(mds_merge, args.repeats, lambda: os.path.exists(mds_index) and os.remove(mds_index))
    merged = os.path.getsize(os.path.join(stoker_root, "index.stoker"))
    print("parts %d, samples %d, shards %d (%.0f MiB), part indexes %.1f MiB" %
          (args.parts, args.samples, shards, shard_bytes / 2**20, index_bytes / 2**20))
    print("stoker merge:        %.2f s (median of %d), merged index %.1f MiB, peak RSS %.0f MiB" %
          (merge_s, args.repeats, merged / 2**20, peak))
    print("stoker index (all):  %.2f s, reading all %.0f MiB of shards (page cache warm)" %
          (reindex_s, shard_bytes / 2**20))
    print("Mosaic merge_index:  %.2f s (shard lists only: no key or label check)" % mds_s)


if __name__ == "__main__":
    main()
