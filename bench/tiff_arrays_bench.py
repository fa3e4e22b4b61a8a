"""Multi-band TIFFs side by side: stoker.Loader with stoker.Array(key="tif")
on a packed ImageFolder tree, against torch's DataLoader reading the same
tree with tifffile.imread (as EuroSAT and other remote-sensing datasets are
read in PyTorch code), both handing over the raw samples stacked into one
tensor per batch ([B, H, W, 13], int32: torch 1.13 has no uint16).

Two shapes of satellite chips, each in 10 class folders:
  eurosat: 64 x 64 px, 13 uint16 bands, uncompressed (EuroSAT MS's files);
  chips:   256 x 256 px, 13 uint16 bands, Deflate with the horizontal
           predictor, 128-px tiles (a cloud-optimised GeoTIFF's layout).
Batch 64, 2 threads/workers on this 2-core machine; each side runs 2
epochs and the second is timed (steady state, page cache warm); peak
memory is the largest PSS summed over the run's process tree, sampled every
50 ms; runs alternate, medians are compared.

    .venv/bin/python bench/tiff_arrays_bench.py [--shape eurosat|chips] [--samples N] [--repeats 3]
"""
import argparse
import os
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHAPES = {"eurosat": dict(side=64, compression=None, tile=None, samples=5000),
          "chips": dict(side=256, compression="zlib", tile=(128, 128), samples=1000)}


def build(work, shape, samples):
    import tifffile
    spec = SHAPES[shape]
    tree = os.path.join(work, "%s-%d" % (shape, samples))
    packed = tree + "-packed"
    if os.path.exists(os.path.join(packed, "index.stoker")):
        return tree, packed
    rng = np.random.default_rng(0)
    side = spec["side"]
    # Smooth fields plus noise: what compresses as real bands do, not white noise.
    y, x = np.mgrid[0:side, 0:side].astype(np.float32)
    for i in range(samples):
        folder = os.path.join(tree, "class%d" % (i % 10))
        os.makedirs(folder, exist_ok=True)
        phase = rng.uniform(0, 6.3, 13).astype(np.float32)
        bands = 1500 + 1000 * np.sin(x[..., None] / 9 + phase) * np.cos(y[..., None] / 13 + phase)
        bands += rng.normal(0, 40, bands.shape)
        kw = dict(photometric="minisblack", planarconfig="contig")
        if spec["compression"]:
            kw.update(compression=spec["compression"], predictor=True, tile=spec["tile"])
        tifffile.imwrite(os.path.join(folder, "%06d.tif" % i), bands.clip(0, 65535).astype(np.uint16), **kw)
    stoker_bin = os.environ.get("STOKER_BIN", os.path.join(ROOT, "build", "release", "stoker"))
    subprocess.run([stoker_bin, "pack", tree, packed, "--force"], check=True, capture_output=True)
    return tree, packed


RUN_STOKER = r'''
import sys, time, stoker
loader = stoker.Loader(sys.argv[1], batch_size=64, num_threads=2, log_epochs=False,
                       fields={"bands": stoker.Array(key="tif"), "label": stoker.Int("cls")})
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        assert batch["bands"].shape[1:] == (int(sys.argv[2]), int(sys.argv[2]), 13)
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
'''

RUN_DATALOADER = r'''
import sys, time
import numpy as np, tifffile, torch, torchvision
class Bands(torchvision.datasets.DatasetFolder):
    def __init__(self, root):
        super().__init__(root, loader=lambda p: torch.from_numpy(tifffile.imread(p).astype(np.int32)),
                         extensions=(".tif",))
loader = torch.utils.data.DataLoader(Bands(sys.argv[1]), batch_size=64, shuffle=True, num_workers=2,
                                     persistent_workers=True)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for bands, label in loader:
        assert bands.shape[1:] == (int(sys.argv[2]), int(sys.argv[2]), 13)
        n += len(label)
    print(epoch, n, time.perf_counter() - t, flush=True)
'''


def tree_pss(pid):
    """PSS of `pid` and all its descendants (shared pages counted once)."""
    total = 0
    try:
        for line in open("/proc/%d/smaps_rollup" % pid):
            if line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    except OSError:
        return 0
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return total + sum(tree_pss(int(c)) for c in children)


def run(name, script, path, side):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "release", "python"))
    proc = subprocess.Popen([sys.executable, "-c", script, path, str(side)], stdout=subprocess.PIPE, text=True,
                            env=env)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_pss(proc.pid))
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    out, _ = proc.communicate()
    done.set()
    if proc.returncode != 0:
        raise SystemExit("%s failed" % name)
    epoch, n, seconds = out.strip().splitlines()[-1].split()
    return int(n) / float(seconds), peak[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="eurosat")
    ap.add_argument("--samples", type=int)
    ap.add_argument("--work", default="/tmp/tiff-bench")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, alternating; medians are compared")
    args = ap.parse_args()
    samples = args.samples or SHAPES[args.shape]["samples"]
    side = SHAPES[args.shape]["side"]
    tree, packed = build(args.work, args.shape, samples)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs)
    print("%d samples of %d x %d x 13 uint16, %.0f KB a file" % (samples, side, side, size / samples / 1e3))
    results = {"stoker": [], "DataLoader+tifffile": []}
    for _ in range(args.repeats):
        for name, script, path in [("stoker", RUN_STOKER, packed), ("DataLoader+tifffile", RUN_DATALOADER, tree)]:
            rate, mem = run(name, script, path, side)
            results[name].append((rate, mem))
            print("%-20s %8.1f samples/s, peak memory %6.0f MiB" % (name, rate, mem / 2**20), flush=True)

    def median(xs):
        return sorted(xs)[len(xs) // 2]
    s_rate, s_mem = (median([r[i] for r in results["stoker"]]) for i in (0, 1))
    d_rate, d_mem = (median([r[i] for r in results["DataLoader+tifffile"]]) for i in (0, 1))
    print("medians: stoker %.1f samples/s, %.0f MiB; DataLoader %.1f samples/s, %.0f MiB" %
          (s_rate, s_mem / 2**20, d_rate, d_mem / 2**20))
    print("stoker: %.2fx the throughput at %.0f%% of the memory" % (s_rate / d_rate, 100 * s_mem / d_mem))


if __name__ == "__main__":
    main()
