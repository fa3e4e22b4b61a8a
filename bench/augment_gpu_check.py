#!/usr/bin/env python3
"""Augmentation steps in the GPU's kernels (part "augment" of scripts/gpu-check).

A detection-style recipe (RandomRotation(15, bilinear), RandomResizedCrop(224),
RandomHorizontalFlip, ColorJitter(0.4, 0.4, 0.4, 0.1), RandomGrayscale,
Normalize, RandomErasing(value=0)) on demo JPEGs, with device="cuda":
gpu_preprocess=True (warps, resize, colour, normalise and erase in the
augmentation kernels) against gpu_preprocess=False (the CPU runs the steps,
the batch is copied), batch by batch in one order. The two make the same
draws; only the resize's arithmetic differs (the kernels' float triangle
filter against Pillow's fixed point), so the values must be close: mean
difference under 1 level, 99% within 4 levels, every erased value erased in
both. Then steady-state images/s of both (second epoch) and the loader
process's CPU time per image.

    PYTHONPATH=build/gpu/python python3 bench/augment_gpu_check.py --json OUT.json [--photos DIR]
    PYTHONPATH=build/release/python .venv/bin/python bench/augment_gpu_check.py --dry-run   # CPU twice
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def recipe(T):
    return T.Compose([T.RandomRotation(15, interpolation="bilinear"), T.RandomResizedCrop(224),
                      T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.RandomGrayscale(0.1),
                      T.ToTensor(), T.Normalize(MEAN, STD), T.RandomErasing(p=0.5, value=0)])


def build(stoker, work, images, photos):
    packed = os.path.join(work, "packed")
    if os.path.exists(os.path.join(packed, "index.stoker")):
        return packed
    demo = os.path.join(work, "demo")
    if not os.path.isdir(demo):
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), demo, "--classes", "4",
                        "--per-class", str(max(1, images // 4)), "--jobs", "4"] + (["--photos", photos] if photos
                                                                                      else []),
                       check=True, capture_output=True)
    stoker.pack(demo, packed)
    return packed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--work", default="/tmp/augment-gpu-check")
    ap.add_argument("--threads", type=int, default=0, help="num_threads (0: the default)")
    ap.add_argument("--json")
    ap.add_argument("--photos", help="make_demo_data.py's --photos (the GPU machine has no scikit-image)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU in place of the GPU: checks the plumbing")
    args = ap.parse_args()
    import torch

    import stoker
    import stoker.transforms as T
    packed = build(stoker, args.work, args.images, args.photos)
    device = "cpu" if args.dry_run else "cuda"
    threads = {"num_threads": args.threads} if args.threads else {}

    def make(gpu_preprocess, shuffle):
        return stoker.Loader(packed, batch_size=64, transform=recipe(T), device=device, seed=3, shuffle=shuffle,
                             gpu_preprocess=gpu_preprocess and not args.dry_run, log_epochs=False, **threads)

    result = {"device": device, "images": 0, "ok": False}
    plain, kernels = make(False, False), make(True, False)
    if not args.dry_run and not kernels.gpu_preprocess:
        raise SystemExit("gpu_preprocess=True fell back: no usable GPU")
    std = torch.tensor(STD).view(1, 3, 1, 1) * 255
    total, far, values, erased, erased_both = 0.0, 0, 0, 0, 0
    for (a, la), (b, lb) in zip(plain, kernels, strict=True):
        a, b = a.float().cpu(), b.float().cpu()
        if not torch.equal(la.cpu(), lb.cpu()):
            raise SystemExit("labels differ: the two loaders read different samples")
        diff = (a - b).abs() * std
        total += diff.sum().item()
        far += (diff > 4).sum().item()
        values += diff.numel()
        erased += (a == 0).sum().item()
        erased_both += ((a == 0) & (b == 0)).sum().item()
        result["images"] += len(la)
    result["mean_levels"] = round(total / max(values, 1), 4)
    result["share_over_4_levels"] = round(far / max(values, 1), 5)
    result["erased_values"], result["erased_in_both"] = erased, erased_both

    def steady(gpu_preprocess):
        loader = make(gpu_preprocess, True)
        for _ in range(2):
            start, cpu0, n = time.perf_counter(), time.process_time(), 0
            for images, labels in loader:
                images.float().mean().item()  # the consumer touches each batch
                n += len(labels)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
        return {"images_per_s": round(n / seconds, 1), "cpu_ms_per_image": round(1000 * cpu / n, 3)}

    result["cpu_steps"] = steady(False)
    result["gpu_kernels"] = steady(True)
    result["ok"] = (result["images"] > 0 and result["mean_levels"] < 1.0 and result["share_over_4_levels"] < 0.01
                    and erased_both == erased)
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
