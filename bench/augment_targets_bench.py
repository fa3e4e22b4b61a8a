#!/usr/bin/env python3
"""The detection recipe with its targets, side by side: RandomRotation(15),
RandomResizedCrop(224), RandomHorizontalFlip, Normalize on the image, with
its boxes (and their labels) and its segmentation mask following.

Data: the demo JPEGs, each given a mask (its luma in 4 classes, PNG) and
three boxes with labels (.npy), written once as WebDataset shards (stoker
reads them, indexed in place) and as loose files (the peers read them).

Columns, --workers each: torch DataLoader with torchvision 0.14's
functional ops written out for the targets (no transforms.v2 there: rotate
and crop the mask with nearest, move box corners, clamp, drop empty boxes),
DataLoader with Albumentations (bbox_params, mask), stoker.Loader with
fields (Boxes, Mask).

    PYTHONPATH=build/release/python <python with albumentations> bench/augment_targets_bench.py \\
        --images demo/images-40x125 --work /tmp/targets-bench [--count 2000] [--batches 25]
"""
import argparse
import glob
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tarfile

import numpy as np
import torch
import torchvision.transforms as tv
import torchvision.transforms.functional as F
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_compare import run  # noqa: E402

import stoker  # noqa: E402
import stoker.transforms as T  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def prepare(images, work, count, stoker_bin):
    shards, loose = os.path.join(work, "shards"), os.path.join(work, "loose")
    if os.path.exists(os.path.join(work, "ready")):
        return shards, loose
    os.makedirs(shards, exist_ok=True)
    os.makedirs(loose, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = sorted(glob.glob(os.path.join(images, "*", "*.JPEG")))[:count]
    tar = None
    for i, path in enumerate(paths):
        if i % 500 == 0:
            if tar:
                tar.close()
            tar = tarfile.open(os.path.join(shards, "shard-%06d.tar" % (i // 500)), "w")
        jpeg = open(path, "rb").read()
        img = Image.open(io.BytesIO(jpeg))
        w, h = img.size
        mask = (np.asarray(img.convert("L")) // 64).astype(np.uint8)
        x0 = rng.integers(0, w // 2, 3)
        y0 = rng.integers(0, h // 2, 3)
        boxes = np.stack([x0, y0, x0 + rng.integers(20, w // 2, 3), y0 + rng.integers(20, h // 2, 3)], 1)
        buf = io.BytesIO()
        Image.fromarray(mask).save(buf, "PNG")
        files = {"jpg": jpeg, "seg.png": buf.getvalue()}
        for name, array in (("boxes.npy", boxes.astype(np.float32)), ("labels.npy", np.arange(3, dtype=np.int64))):
            b = io.BytesIO()
            np.save(b, array)
            files[name] = b.getvalue()
        for ext, data in files.items():
            info = tarfile.TarInfo("%06d.%s" % (i, ext))
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            with open(os.path.join(loose, "%06d.%s" % (i, ext)), "wb") as f:
                f.write(data)
    tar.close()
    subprocess.run([stoker_bin, "index", *sorted(glob.glob(os.path.join(shards, "*.tar")))], check=True,
                   stdout=subprocess.DEVNULL)
    open(os.path.join(work, "ready"), "w").close()
    return shards, loose


class Loose(torch.utils.data.Dataset):
    def __init__(self, root):
        self.keys = sorted(p[:-4] for p in glob.glob(os.path.join(root, "*.jpg")))

    def __len__(self):
        return len(self.keys)

    def load(self, i):
        k = self.keys[i]
        return (Image.open(k + ".jpg").convert("RGB"), Image.open(k + ".seg.png"), np.load(k + ".boxes.npy"),
                np.load(k + ".labels.npy"))


def move_boxes(boxes, forward, w, h):
    """Corners through `forward` (2x3), the enclosing box, clamped; keeps those with area."""
    corners = np.stack([boxes[:, [0, 1]], boxes[:, [2, 1]], boxes[:, [2, 3]], boxes[:, [0, 3]]], 1)
    moved = corners @ forward[:, :2].T + forward[:, 2]
    out = np.concatenate([moved.min(1), moved.max(1)], 1)
    out = np.clip(out, 0, [w, h, w, h])
    return out, (out[:, 2] > out[:, 0]) & (out[:, 3] > out[:, 1])


class TorchvisionTargets(Loose):
    """What a torchvision 0.14 user writes for targets: functional ops per sample."""

    def __getitem__(self, i):
        img, mask, boxes, labels = self.load(i)
        angle = float(torch.empty(1).uniform_(-15, 15))
        w, h = img.size
        img, mask = F.rotate(img, angle), F.rotate(mask, angle)
        a = math.radians(angle)
        rot = np.array([[math.cos(a), math.sin(a), 0], [-math.sin(a), math.cos(a), 0]])
        rot[:, 2] = [w / 2, h / 2] - rot[:, :2] @ [w / 2, h / 2]
        boxes, keep = move_boxes(boxes, rot, w, h)
        top, left, ch, cw = tv.RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
        img = F.resized_crop(img, top, left, ch, cw, [224, 224])
        mask = F.resized_crop(mask, top, left, ch, cw, [224, 224], tv.InterpolationMode.NEAREST)
        scale = np.array([[224 / cw, 0, -left * 224 / cw], [0, 224 / ch, -top * 224 / ch]])
        boxes, keep2 = move_boxes(boxes, scale, 224, 224)
        keep &= keep2
        if torch.rand(1) < 0.5:
            img, mask = F.hflip(img), F.hflip(mask)
            boxes = np.stack([224 - boxes[:, 2], boxes[:, 1], 224 - boxes[:, 0], boxes[:, 3]], 1)
        image = F.normalize(F.to_tensor(img), MEAN, STD)
        return image, torch.from_numpy(np.array(mask)), torch.from_numpy(boxes[keep]), torch.from_numpy(labels[keep])


class AlbumentationsTargets(Loose):
    def __init__(self, root):
        super().__init__(root)
        import albumentations as A
        import cv2
        from albumentations.pytorch import ToTensorV2
        self.cv2 = cv2
        self.transform = A.Compose([A.Rotate(limit=15, border_mode=cv2.BORDER_CONSTANT, p=1),
                                    A.RandomResizedCrop(224, 224), A.HorizontalFlip(), A.Normalize(MEAN, STD),
                                    ToTensorV2()],
                                   bbox_params=A.BboxParams(format="pascal_voc", label_fields=["labels"]))

    def __getitem__(self, i):
        k = self.keys[i]
        image = self.cv2.cvtColor(self.cv2.imread(k + ".jpg"), self.cv2.COLOR_BGR2RGB)
        mask = self.cv2.imread(k + ".seg.png", self.cv2.IMREAD_UNCHANGED)
        h, w = mask.shape
        boxes = np.clip(np.load(k + ".boxes.npy"), 0, [w, h, w, h])
        out = self.transform(image=image, mask=mask, bboxes=boxes, labels=np.load(k + ".labels.npy"))
        return out["image"], out["mask"], torch.tensor(out["bboxes"]).reshape(-1, 4), torch.tensor(out["labels"])


def collate(batch):
    images, masks, boxes, labels = zip(*batch)
    return torch.stack(images), torch.stack(masks), list(boxes), list(labels)


def batches_of(loader):
    while True:
        for batch in loader:
            if isinstance(batch, dict):
                yield batch["image"], batch["boxes"]
            else:
                yield batch[0], batch[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True)
    parser.add_argument("--work", required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--batches", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--json")
    parser.add_argument("--column", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")
    stoker_bin = os.environ.get("STOKER_BIN", "build/release/stoker")
    shards, loose = prepare(args.images, args.work, args.count, stoker_bin)

    def make(name):
        if name == "stoker":
            fields = {"image": stoker.Image(transform=T.Compose([T.RandomRotation(15), T.RandomResizedCrop(224),
                                                                  T.RandomHorizontalFlip(),
                                                                  T.Normalize(MEAN, STD)])),
                      "boxes": stoker.Boxes(labels="labels"), "labels": stoker.Array("labels.npy"),
                      "mask": stoker.Mask()}
            return lambda: batches_of(stoker.Loader(shards, batch_size=args.batch_size, fields=fields,
                                                    num_threads=args.workers, log_epochs=False))
        dataset = TorchvisionTargets(loose) if name == "torchvision" else AlbumentationsTargets(loose)
        return lambda: batches_of(torch.utils.data.DataLoader(
            dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers, persistent_workers=True,
            drop_last=True, collate_fn=collate))

    if args.column:
        print("RESULT " + json.dumps(run(args.column, make(args.column), args.batches, args.warmup)), flush=True)
        return
    rows = []
    for name in ("torchvision", "stoker", "albumentations"):
        if name == "albumentations" and importlib.util.find_spec("albumentations") is None:
            print("albumentations column skipped: not installed")
            continue
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--column", name],
                             stdout=subprocess.PIPE, text=True)
        lines = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            raise SystemExit("column %s failed (exit %d)" % (name, out.returncode))
        rows.append(json.loads(lines[-1][len("RESULT "):]))
    print("detection recipe with boxes and mask, %d workers/threads, batch %d:" % (args.workers, args.batch_size))
    print("  %-16s %10s %12s %14s" % ("loader", "images/s", "CPU ms/img", "peak PSS sum"))
    for r in rows:
        print("  %-16s %10.0f %12.2f %11.0f MiB" % (r["loader"], r["images_per_s"], 1000 * r["cpu_s_per_image"],
                                                    r["peak_pss_bytes"] / 2**20))
    by = {r["loader"]: r for r in rows}
    line = "  stoker: %.2fx the torchvision DataLoader's images/s" % (
        by["stoker"]["images_per_s"] / by["torchvision"]["images_per_s"])
    if "albumentations" in by:
        line += ", %.2fx Albumentations'" % (by["stoker"]["images_per_s"] / by["albumentations"]["images_per_s"])
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
