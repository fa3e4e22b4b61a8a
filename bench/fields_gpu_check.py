#!/usr/bin/env python3
"""Typed fields with device="cuda" (part "fields" of scripts/gpu-check).

On the mixed samples of bench/fields_compare.py (JPEG cropped to 224 and
normalised, PNG mask decoded whole, JSON boxes, .npy embedding, caption,
label): a loader with device="cuda" against the same loader on the CPU,
batch by batch in one order. Every tensor field must arrive on the GPU with
the CPU batch's values; lists (masks at their own sizes, boxes, captions)
stay on the host, equal. Then steady-state samples/s of both (second epoch),
with a consumer that touches each batch on the GPU, and the share of the
CUDA loader's next() spent waiting.

    PYTHONPATH=build/gpu/python python3 bench/fields_gpu_check.py --json OUT.json
    PYTHONPATH=build/release/python .venv/bin/python bench/fields_gpu_check.py --dry-run   # CPU twice
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def make_loader(stoker, shards, device, shuffle):
    T = stoker.transforms
    fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                         T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])),
              "mask": stoker.Image(keys="seg.png", mode="L"), "label": stoker.Int("cls"), "boxes": stoker.Json(),
              "emb": stoker.Array(), "caption": stoker.Text()}
    return stoker.Loader(shards, batch_size=64, fields=fields, device=device, shuffle=shuffle, seed=1,
                         log_epochs=False, with_indices=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=512)
    ap.add_argument("--work", default="/tmp/fields-gpu-check")
    ap.add_argument("--json")
    ap.add_argument("--photos", help="make_demo_data.py's --photos (the GPU machine has no scikit-image)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU in place of the GPU: checks the plumbing")
    args = ap.parse_args()
    import torch

    import fields_compare
    import stoker
    shards = fields_compare.build(args.work, args.images, args.photos)
    device = "cpu" if args.dry_run else "cuda"
    result = {"device": device, "samples": 0, "mismatches": [], "ok": False}

    cpu, gpu = make_loader(stoker, shards, "cpu", False), make_loader(stoker, shards, device, False)
    if not args.dry_run and gpu.device == "cpu":
        raise SystemExit("device='cuda' fell back to the CPU: no usable GPU")
    for a, b in zip(cpu, gpu, strict=True):
        for name in a:
            x, y = a[name], b[name]
            if torch.is_tensor(x):
                if not torch.is_tensor(y) or y.device.type != device or not torch.equal(x, y.cpu()):
                    result["mismatches"].append("%s: tensor differs or is not on %s" % (name, device))
            elif not isinstance(y, list) or len(x) != len(y):
                result["mismatches"].append("%s: not a list of the same length" % name)
            else:
                for u, v in zip(x, y):
                    same = torch.equal(u, v) and v.device.type == "cpu" if torch.is_tensor(u) else u == v
                    if not same:
                        result["mismatches"].append("%s: a list item differs or left the host" % name)
                        break
        result["samples"] += len(a["label"])
    result["mismatches"] = sorted(set(result["mismatches"]))

    def steady(device):
        loader = make_loader(stoker, shards, device, True)
        for epoch in range(2):
            start, n, waited = time.perf_counter(), 0, 0.0
            it = iter(loader)
            while True:
                asked = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                waited += time.perf_counter() - asked
                (batch["image"].float().mean() + batch["emb"].float().mean()).item()  # the consumer touches it
                n += len(batch["label"])
            seconds = time.perf_counter() - start
        return {"samples_per_s": round(n / seconds, 1), "wait_share": round(waited / seconds, 3)}
    result["cpu"] = steady("cpu")
    result[device + "_loader"] = steady(device)
    result["ok"] = not result["mismatches"] and result["samples"] == args.images - args.images % 4
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
