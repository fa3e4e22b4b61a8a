"""RGB-D samples side by side (depth estimation, NYU-Depth-style):
stoker.Loader with the depth map following the image
(stoker.Array("depth.npy", follows="image")) against torch's DataLoader
over webdataset doing the same with torchvision's functional ops, on the
same shards.

Each sample: an ImageNet-density JPEG (make_demo_data's photographs, the
ones bench/fields_compare.py uses) and a float32 depth map of its size in
a .npy (smooth, with noise and holes of 0, as a depth sensor gives). Both
sides take RandomResizedCrop(224) and a random horizontal flip on the
image and on its depth map (bilinear with antialiasing for the image,
nearest for the depth, so no depth value is invented between an object
and its background), normalise the image to float32 and stack both.
Batch 64, 2 threads/workers; each side runs 2 epochs and the second is
timed (steady state, page cache warm); peak memory is the largest PSS
summed over the run's process tree, sampled every 50 ms; runs alternate,
medians are compared.

    .venv/bin/python bench/depth_compare.py [--images 1000] [--repeats 3] [--work /tmp/depth-bench]
"""
import argparse
import io
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from fields_compare import demo_jpegs, print_run, report, run, write_shards  # noqa: E402  (run: a fresh process, peak PSS and RSS)


def depth_of(width, height, rng):
    """Metres: a tilted floor and a few objects, sensor noise, holes of 0."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    depth = 1.5 + 4.0 * (1 - y / height) + 0.3 * np.sin(x / 37 + rng.uniform(0, 6))
    for _ in range(3):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, 80)
        depth[(x - cx) ** 2 + (y - cy) ** 2 < r * r] = rng.uniform(0.8, 3.0)
    depth += rng.normal(0, 0.01, depth.shape).astype(np.float32)
    depth[rng.random(depth.shape) < 0.02] = 0  # no return
    return depth.astype(np.float32)


def build(work, images):
    shards = os.path.join(work, "shards-%d" % images)
    if os.path.exists(os.path.join(shards, "index.stoker")):
        return shards
    from PIL import Image
    rng = np.random.default_rng(0)

    def samples():
        for i, path in enumerate(demo_jpegs(work, images)[:images]):
            jpg = open(path, "rb").read()
            width, height = Image.open(io.BytesIO(jpg)).size
            buf = io.BytesIO()
            np.save(buf, depth_of(width, height, rng))
            yield "%07d" % i, {"jpg": jpg, "depth.npy": buf.getvalue(), "cls": b"%d" % (i % 4)}

    write_shards(shards, samples(), 256 << 20)
    return shards


RUN_STOKER = r'''
import sys, time, stoker
T = stoker.transforms
fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                     T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])),
          "depth": stoker.Array("depth.npy", follows="image"), "label": stoker.Int("cls")}
loader = stoker.Loader(sys.argv[1], batch_size=64, num_threads=2, fields=fields, log_epochs=False)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        assert batch["depth"].shape[1:] == (224, 224) and batch["image"].shape[1:] == (3, 224, 224)
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
'''

RUN_DATALOADER = r'''
import glob, io, random, sys, time
import numpy as np, torch, webdataset as wds
import torchvision.transforms as tv
import torchvision.transforms.functional as F
from PIL import Image
crop = tv.RandomResizedCrop(224)
def decode(s):
    image = Image.open(io.BytesIO(s["jpg"])).convert("RGB")
    depth = torch.from_numpy(np.load(io.BytesIO(s["depth.npy"])))[None]
    top, left, h, w = crop.get_params(image, crop.scale, crop.ratio)
    image = F.resized_crop(image, top, left, h, w, [224, 224], tv.InterpolationMode.BILINEAR)
    depth = F.resized_crop(depth, top, left, h, w, [224, 224], tv.InterpolationMode.NEAREST)[0]
    if random.random() < 0.5:
        image, depth = F.hflip(image), depth.flip(-1)
    image = F.normalize(F.to_tensor(image), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    return image, depth, int(s["cls"])
urls = sorted(glob.glob(sys.argv[1] + "/*.tar"))
dataset = wds.WebDataset(urls, shardshuffle=True).shuffle(1000).map(decode)
loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=2, persistent_workers=True)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for image, depth, label in loader:
        assert depth.shape[1:] == (224, 224) and image.shape[1:] == (3, 224, 224)
        n += len(label)
    print(epoch, n, time.perf_counter() - t, flush=True)
'''


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--work", default="/tmp/depth-bench")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, alternating; medians are compared")
    args = ap.parse_args()
    shards = build(args.work, args.images)
    size = sum(os.path.getsize(os.path.join(shards, f)) for f in os.listdir(shards) if f.endswith(".tar"))
    print("%d RGB-D samples, %.0f KB each" % (args.images, size / args.images / 1e3))
    results = {"stoker": [], "DataLoader+webdataset": []}
    for _ in range(args.repeats):
        for name, script in [("stoker", RUN_STOKER), ("DataLoader+webdataset", RUN_DATALOADER)]:
            results[name].append(run(name, script, shards))
            print_run(name, results[name][-1])

    report(results, "stoker", "DataLoader+webdataset")


if __name__ == "__main__":
    main()
