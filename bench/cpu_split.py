#!/usr/bin/env python3
"""Runs one loader for SECONDS, for `perf record -a` to attribute its CPU
time in steady state (README, "Where each image's CPU time goes"):

    PYTHONPATH=build/release/python .venv/bin/python bench/cpu_split.py stoker demo/seekable-40x125 40 &
    sleep 15; perf record -a -F 499 -o split.perf -- sleep 20
    perf report -i split.perf --no-children --sort dso,sym --stdio

LOADER is `stoker` (a packed dataset), `dataloader` (torch DataLoader over
a torchvision ImageFolder tree) or `dali` (DALI's CPU pipeline over the tree,
as bench/loader_compare.py builds it); all use the ImageNet training transform,
batch 64, 2 threads or workers. Prints the images/s of the window 15-35 s.
"""
import os
import sys
import time

import torch
import torchvision
import torchvision.transforms as tv

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main():
    kind, path, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if kind == "stoker":
        import stoker
        import stoker.transforms as T
        transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)])
        loader = stoker.Loader(path, batch_size=64, transform=transform, num_threads=2, log_epochs=False)
    elif kind == "dali":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from loader_compare import dali_batches

        def epochs():
            batches = dali_batches(path, 64, 2)
            while True:
                yield [next(batches) for _ in range(50)]
        loader = epochs()
        loader = type("Dali", (), {"__iter__": lambda self, it=loader: iter(next(it))})()
    else:
        transform = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(),
                                tv.Normalize(MEAN, STD)])
        dataset = torchvision.datasets.ImageFolder(path, transform=transform)
        loader = torch.utils.data.DataLoader(dataset, batch_size=64, shuffle=True, num_workers=2,
                                             persistent_workers=True, drop_last=True)
    start, images, marks, epoch = time.time(), 0, [], 0
    while time.time() - start < seconds:
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        epoch += 1
        for x, _ in loader:
            images += x.shape[0]
            marks.append((time.time() - start, images))
            if time.time() - start > seconds:
                break
    window = [m for m in marks if 15 <= m[0] <= 35]
    if len(window) > 1:
        print("images/s in the window 15-35 s: %.0f" % ((window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])))


if __name__ == "__main__":
    main()
