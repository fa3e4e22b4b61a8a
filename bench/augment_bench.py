#!/usr/bin/env python3
"""Augmentation recipes side by side on the same JPEGs, batch 64, float32
NCHW, each column in a fresh process (loader_compare.py's harness):

  classification: RandomResizedCrop(224), RandomHorizontalFlip, RandAugment(2, 9),
                  Normalize, RandomErasing
  detection-style (image only): RandomRotation(15), RandomResizedCrop(224),
                  RandomHorizontalFlip, Normalize
  jitter (--recipes jitter): RandomRotation(15, bilinear), RandomResizedCrop(224),
                  RandomHorizontalFlip, ColorJitter(0.4, 0.4, 0.4, 0.1), Normalize,
                  RandomErasing(value=0): what the GPU's augmentation kernels
                  run with gpu_preprocess=True (bench/augment_host_bench.cc
                  measures the host's share of it there)

Columns: torch DataLoader over ImageFolder with torchvision's transforms,
stoker.Loader on packed shards with the same transforms, and a DataLoader
with Albumentations (PyPI; OpenCV decode; closest equivalents: no RandAugment
there, so SomeOf(2) over its matching operations). Each with --workers
processes or threads.

    PYTHONPATH=build/release/python <python with albumentations> bench/augment_bench.py \\
        --images demo/images-40x125 --packed demo/packed-40x125 [--batches 40] [--json out.json]
"""
import argparse
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import torch
import torchvision
import torchvision.transforms as tv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_compare import forever, run  # noqa: E402

import stoker  # noqa: E402
import stoker.transforms as T  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def torchvision_recipe(recipe):
    if recipe == "classification":
        return tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.RandAugment(2, 9), tv.ToTensor(),
                           tv.Normalize(MEAN, STD), tv.RandomErasing()])
    if recipe == "jitter":
        return tv.Compose([tv.RandomRotation(15, interpolation=tv.InterpolationMode.BILINEAR), tv.RandomResizedCrop(224),
                           tv.RandomHorizontalFlip(), tv.ColorJitter(0.4, 0.4, 0.4, 0.1), tv.ToTensor(),
                           tv.Normalize(MEAN, STD), tv.RandomErasing(value=0)])
    return tv.Compose([tv.RandomRotation(15), tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(),
                       tv.Normalize(MEAN, STD)])


def stoker_recipe(recipe):
    if recipe == "classification":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.RandAugment(2, 9), T.ToTensor(),
                          T.Normalize(MEAN, STD), T.RandomErasing()])
    if recipe == "jitter":
        return T.Compose([T.RandomRotation(15, interpolation="bilinear"), T.RandomResizedCrop(224),
                          T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(),
                          T.Normalize(MEAN, STD), T.RandomErasing(value=0)])
    return T.Compose([T.RandomRotation(15), T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])


class AlbumentationsFolder(torch.utils.data.Dataset):
    """ImageFolder read with OpenCV, transformed by an Albumentations pipeline."""

    def __init__(self, root, recipe):
        import albumentations as A
        import cv2
        from albumentations.pytorch import ToTensorV2
        self.cv2 = cv2
        self.items = torchvision.datasets.ImageFolder(root).samples
        if recipe == "classification":
            ops = [A.Affine(shear=(-17, 17), p=1), A.Affine(translate_percent=(-0.45, 0.45), p=1),
                   A.Rotate(limit=9, border_mode=cv2.BORDER_CONSTANT, p=1),
                   A.ColorJitter(brightness=0.27, contrast=0.27, saturation=0.27, hue=0, p=1),
                   A.Sharpen(p=1), A.Posterize(num_bits=6, p=1), A.Solarize(p=1), A.Equalize(p=1),
                   A.AutoContrast(p=1) if hasattr(A, "AutoContrast") else A.RandomBrightnessContrast(p=1)]
            self.transform = A.Compose([A.RandomResizedCrop(224, 224), A.HorizontalFlip(), A.SomeOf(ops, n=2),
                                        A.Normalize(MEAN, STD), A.CoarseDropout(p=0.5), ToTensorV2()])
        elif recipe == "jitter":
            self.transform = A.Compose([A.Rotate(limit=15, interpolation=cv2.INTER_LINEAR,
                                                 border_mode=cv2.BORDER_CONSTANT, p=1),
                                        A.RandomResizedCrop(224, 224), A.HorizontalFlip(),
                                        A.ColorJitter(0.4, 0.4, 0.4, 0.1, p=1), A.Normalize(MEAN, STD),
                                        A.CoarseDropout(p=0.5), ToTensorV2()])
        else:
            self.transform = A.Compose([A.Rotate(limit=15, border_mode=cv2.BORDER_CONSTANT, p=1),
                                        A.RandomResizedCrop(224, 224), A.HorizontalFlip(), A.Normalize(MEAN, STD),
                                        ToTensorV2()])

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        path, label = self.items[i]
        image = self.cv2.cvtColor(self.cv2.imread(path), self.cv2.COLOR_BGR2RGB)
        return self.transform(image=image)["image"], label


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True)
    parser.add_argument("--packed", required=True)
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--recipes", default="classification,detection")
    parser.add_argument("--json")
    parser.add_argument("--column", help=argparse.SUPPRESS)  # internal: "recipe:name"
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.environ.setdefault("NO_ALBUMENTATIONS_UPDATE", "1")

    def make(recipe, name):
        if name == "torchvision":
            dataset = torchvision.datasets.ImageFolder(args.images, transform=torchvision_recipe(recipe))
        elif name == "albumentations":
            dataset = AlbumentationsFolder(args.images, recipe)
        else:
            transform = stoker_recipe(recipe)
            return lambda: forever(stoker.Loader(args.packed, batch_size=args.batch_size, transform=transform,
                                                 num_threads=args.workers, log_epochs=False))
        return lambda: forever(torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                                                           num_workers=args.workers, persistent_workers=True,
                                                           drop_last=True))

    if args.column:
        recipe, name = args.column.split(":")
        result = run(name, make(recipe, name), args.batches, args.warmup)
        print("RESULT " + json.dumps(result), flush=True)
        return

    results = {}
    for recipe in args.recipes.split(","):
        for name in ("torchvision", "stoker", "albumentations"):
            if name == "albumentations" and importlib.util.find_spec("albumentations") is None:
                print("albumentations column skipped: not installed (pip install albumentations)")
                continue
            argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--column", "%s:%s" % (recipe, name)]
            out = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise SystemExit("column %s:%s failed (exit %d)" % (recipe, name, out.returncode))
            results.setdefault(recipe, []).append(json.loads(lines[-1][len("RESULT "):]))

    for recipe, rows in results.items():
        print("%s recipe, %d workers/threads, batch %d:" % (recipe, args.workers, args.batch_size))
        print("  %-16s %10s %12s %14s" % ("loader", "images/s", "CPU ms/img", "peak PSS sum"))
        for r in rows:
            print("  %-16s %10.0f %12.2f %11.0f MiB" % (r["loader"], r["images_per_s"], 1000 * r["cpu_s_per_image"],
                                                        r["peak_pss_bytes"] / 2**20))
        by = {r["loader"]: r for r in rows}
        s, t = by["stoker"], by["torchvision"]
        line = "  stoker: %.2fx torchvision DataLoader's images/s" % (s["images_per_s"] / t["images_per_s"])
        if "albumentations" in by:
            a = by["albumentations"]
            line += ", %.2fx Albumentations' images/s, CPU per image %.2f ms vs %.2f ms" % (
                s["images_per_s"] / a["images_per_s"], 1000 * s["cpu_s_per_image"], 1000 * a["cpu_s_per_image"])
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
