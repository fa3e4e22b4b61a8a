"""Multi-band TIFFs side by side: stoker.Loader with stoker.Array(key="tif")
on a packed ImageFolder tree, against torch's DataLoader reading the same
tree with tifffile.imread (as EuroSAT and other remote-sensing datasets are
read in PyTorch code), both handing over the raw samples stacked into one
tensor per batch ([B, H, W, 13], int32: torch 1.13 has no uint16).

Two shapes of satellite chips, each in 10 class folders:
  eurosat: 64 x 64 px, 13 uint16 bands, uncompressed (EuroSAT MS's files);
  chips:   256 x 256 px, 13 uint16 bands, Deflate with the horizontal
           predictor, 128-px tiles (a cloud-optimised GeoTIFF's layout).
With --augment both sides also take a random crop of 7/8 of the side, flip
at random both ways and normalise each band to float32 (stoker:
Array(transform=[RandomCrop, RandomHorizontalFlip, RandomVerticalFlip,
Normalize]); the DataLoader: the same in NumPy in its workers).
Batch 64, 2 threads/workers on this 2-core machine; each side runs 2
epochs and the second is timed (steady state, page cache warm); peak
memory is the largest PSS summed over the run's process tree, sampled every
50 ms; runs alternate, medians are compared.

    .venv/bin/python bench/tiff_arrays_bench.py [--shape eurosat|chips] [--samples N] [--repeats 3] [--augment]
"""
import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from fields_compare import print_run, report, run  # noqa: E402  (a fresh process a run, its tree's peak PSS and RSS)
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


MEAN = [1500.0 + 10 * b for b in range(13)]
STD = [700.0 + 5 * b for b in range(13)]

RUN_STOKER = r'''
import sys, time, stoker
T = stoker.transforms
side, augment = int(sys.argv[2]), sys.argv[3] == "1"
crop = side * 7 // 8 if augment else side
steps = [T.RandomCrop(crop), T.RandomHorizontalFlip(), T.RandomVerticalFlip(),
         T.Normalize(%r, %r)] if augment else None
loader = stoker.Loader(sys.argv[1], batch_size=64, num_threads=2, log_epochs=False,
                       fields={"bands": stoker.Array(key="tif", transform=steps), "label": stoker.Int("cls")})
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        assert batch["bands"].shape[1:] == (crop, crop, 13)
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
''' % (MEAN, STD)

RUN_DATALOADER = r'''
import sys, time
import numpy as np, tifffile, torch, torchvision
side, augment = int(sys.argv[2]), sys.argv[3] == "1"
crop = side * 7 // 8 if augment else side
mean, std = np.array(%r, np.float32), np.array(%r, np.float32)
def load(path):
    bands = tifffile.imread(path)
    if not augment:
        return torch.from_numpy(bands.astype(np.int32))
    top, left = np.random.randint(0, side - crop + 1, 2)
    bands = bands[top:top + crop, left:left + crop]
    if np.random.rand() < 0.5:
        bands = bands[:, ::-1]
    if np.random.rand() < 0.5:
        bands = bands[::-1]
    return torch.from_numpy((bands.astype(np.float32) - mean) / std)
class Bands(torchvision.datasets.DatasetFolder):
    def __init__(self, root):
        super().__init__(root, loader=load, extensions=(".tif",))
loader = torch.utils.data.DataLoader(Bands(sys.argv[1]), batch_size=64, shuffle=True, num_workers=2,
                                     persistent_workers=True)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for bands, label in loader:
        assert bands.shape[1:] == (crop, crop, 13)
        n += len(label)
    print(epoch, n, time.perf_counter() - t, flush=True)
''' % (MEAN, STD)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", choices=sorted(SHAPES), default="eurosat")
    ap.add_argument("--samples", type=int)
    ap.add_argument("--work", default="/tmp/tiff-bench")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, alternating; medians are compared")
    ap.add_argument("--augment", action="store_true", help="random crop, flips and per-band normalisation too")
    args = ap.parse_args()
    samples = args.samples or SHAPES[args.shape]["samples"]
    side = SHAPES[args.shape]["side"]
    tree, packed = build(args.work, args.shape, samples)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tree) for f in fs)
    print("%d samples of %d x %d x 13 uint16, %.0f KB a file" % (samples, side, side, size / samples / 1e3))
    results = {"stoker": [], "DataLoader+tifffile": []}
    for _ in range(args.repeats):
        for name, script, path in [("stoker", RUN_STOKER, packed), ("DataLoader+tifffile", RUN_DATALOADER, tree)]:
            results[name].append(run(name, script, path, side, int(args.augment)))
            print_run(name, results[name][-1])

    report(results, "stoker", "DataLoader+tifffile")


if __name__ == "__main__":
    main()
