"""Writing a dataset from Python, side by side: stoker.DatasetWriter against
webdataset.ShardWriter and Mosaic Streaming's MDSWriter, on the same samples.

Each sample: an ImageNet-density JPEG (the demo photographs, ~85 KB, read
into memory first, so the figure is the writer's, not the source's), its
label, a float32 (N, 4) box array and a small JSON record. Every writer
makes shards of about 64 MiB in a fresh folder. stoker's output is a
finished, indexed dataset (its index built while writing; each shard is
fsynced before it is renamed); webdataset's shards need `stoker index`
before stoker reads them (timed separately) and are not fsynced; MDS writes
its own index, no fsync. The figure is the median of --repeats runs.

    PYTHONPATH=build/release/python /tmp/peer-venv/bin/python bench/writer_compare.py \
        --images /tmp/demo/images-40x125 [--samples 5000] [--repeats 3]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def load_samples(folder, limit):
    paths = []
    for root, _, files in os.walk(folder):
        paths += [os.path.join(root, f) for f in files if f.lower().endswith((".jpeg", ".jpg"))]
    paths.sort()
    classes = sorted({os.path.basename(os.path.dirname(p)) for p in paths})
    rng = np.random.default_rng(0)
    samples = []
    for i, p in enumerate(paths[:limit]):
        with open(p, "rb") as f:
            data = f.read()
        n = int(rng.integers(1, 8))
        samples.append({"key": "%08d" % i, "jpg": data, "cls": classes.index(os.path.basename(os.path.dirname(p))),
                        "boxes": rng.random((n, 4), dtype=np.float32),
                        "meta": {"source": os.path.basename(p), "width": 500, "height": 375}})
    return samples


def write_stoker(samples, out):
    import stoker
    with stoker.DatasetWriter(out, shard_size="64MiB") as w:
        for s in samples:
            w.write({"__key__": s["key"], "jpg": s["jpg"], "cls": s["cls"], "boxes.npy": s["boxes"],
                     "json": s["meta"]})


def write_webdataset(samples, out):
    import webdataset as wds
    os.makedirs(out)
    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxsize=64 << 20, maxcount=10 ** 9,
                         verbose=0) as w:
        for s in samples:
            w.write({"__key__": s["key"], "jpg": s["jpg"], "cls": s["cls"], "boxes.npy": s["boxes"],
                     "json": s["meta"]})


def write_mds(samples, out):
    from streaming import MDSWriter
    columns = {"jpg": "bytes", "cls": "int", "boxes": "ndarray:float32", "json": "json"}
    with MDSWriter(out=out, columns=columns, size_limit=64 << 20, compression=None) as w:
        for s in samples:
            w.write({"jpg": s["jpg"], "cls": s["cls"], "boxes": s["boxes"], "json": s["meta"]})


def timed(fn, samples, out):
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    fn(samples, out)
    return time.perf_counter() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", required=True, help="a folder of JPEGs (ImageFolder layout)")
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/writer-bench")
    ap.add_argument("--stoker-bin", default=os.path.join(ROOT, "build", "release", "stoker"))
    args = ap.parse_args()
    samples = load_samples(args.images, args.samples)
    payload = sum(len(s["jpg"]) for s in samples)
    print("%d samples, %.1f MB of JPEG, %s" % (len(samples), payload / 1e6, sys.version.split()[0]))
    writers = [("stoker.DatasetWriter", write_stoker), ("webdataset.ShardWriter", write_webdataset),
               ("streaming.MDSWriter", write_mds)]
    results = {}
    for name, fn in writers:
        times = [timed(fn, samples, os.path.join(args.work, name)) for _ in range(args.repeats)]
        results[name] = statistics.median(times)
    start = time.perf_counter()
    subprocess.run([args.stoker_bin, "index", os.path.join(args.work, "webdataset.ShardWriter"), "--force"],
                   check=True, capture_output=True)
    index_s = time.perf_counter() - start
    print("%-24s %10s %12s %10s" % ("writer", "seconds", "samples/s", "MB/s"))
    for name, seconds in results.items():
        print("%-24s %10.2f %12.0f %10.0f" % (name, seconds, len(samples) / seconds, payload / seconds / 1e6))
    print("stoker index over webdataset.ShardWriter's shards: %.2f s more" % index_s)
    shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
