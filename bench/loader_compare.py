#!/usr/bin/env python3
"""Side by side on the same JPEGs: stoker.Loader (packed shards, and loose files) vs torch
DataLoader over torchvision ImageFolder, with the ImageNet training transform
(RandomResizedCrop(224) + RandomHorizontalFlip + Normalize -> float32 NCHW),
batch 64. Reports images/s, CPU seconds per image and the peak memory of the
whole process tree (RSS summed, and PSS, which counts shared pages once).
Each column runs in a fresh process (torch, torchvision and stoker imported
in each), so none inherits the memory another left behind.

    PYTHONPATH=build/release/python .venv/bin/python bench/loader_compare.py \\
        --images demo/images-40x125 --packed demo/packed-40x125 [--seekable demo/seekable-40x125] \\
        [--batches 60] [--json out.json]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import torchvision
import torchvision.transforms as tv

import stoker
import stoker.transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def tree_pids():
    pids = [os.getpid()]
    try:
        with open("/proc/%d/task/%d/children" % (os.getpid(), os.getpid())) as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


def memory(pid):
    rss = pss = 0
    try:
        with open("/proc/%d/smaps_rollup" % pid) as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


class PeakMemory:
    """Samples the process tree's memory every 100 ms."""

    def __init__(self):
        self.peak_rss = self.peak_pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            rss = pss = 0
            for pid in tree_pids():
                r, p = memory(pid)
                rss += r
                pss += p
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(0.1)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def cpu_seconds():
    self_t = os.times()
    return self_t.user + self_t.system + self_t.children_user + self_t.children_system


def children_cpu():
    """CPU of live children (os.times only counts children that have exited)."""
    total = 0.0
    tick = os.sysconf("SC_CLK_TCK")
    for pid in tree_pids()[1:]:
        try:
            with open("/proc/%d/stat" % pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError):
            pass
    return total


def run(name, make_iter, batches, warmup, consumer_ms=0.0):
    """Times `batches` batches after `warmup` ones; with consumer_ms, each
    batch is followed by a simulated accelerator step of that many ms."""
    with PeakMemory() as mem:
        it = make_iter()
        for _ in range(warmup):
            next(it)
        cpu0 = cpu_seconds() + children_cpu()
        t0 = time.perf_counter()
        images = 0
        compute = 0.0
        for _ in range(batches):
            x, y = next(it)
            images += x.shape[0]
            if consumer_ms:
                step = time.perf_counter()
                time.sleep(consumer_ms / 1000)
                compute += time.perf_counter() - step
        wall = time.perf_counter() - t0
        cpu = cpu_seconds() + children_cpu() - cpu0
        del it
    result = {"loader": name, "images": images, "wall_s": wall, "images_per_s": images / wall,
              "cpu_s_per_image": cpu / images, "peak_rss_bytes": mem.peak_rss, "peak_pss_bytes": mem.peak_pss}
    if consumer_ms:
        result["consumer_ms"] = consumer_ms
        result["accelerator_utilization"] = compute / wall
    return result


def spdl_batches(images_root, batch_size, threads):
    """SPDL (FFmpeg decode with a crop/scale/flip filter per image, on its
    thread pipeline), the same augmentation semantics: torchvision's
    RandomResizedCrop parameters, bilinear scale, flip, then normalise."""
    import random

    import spdl.io
    from spdl.pipeline import PipelineBuilder

    items = [(path, label) for path, label in torchvision.datasets.ImageFolder(images_root).samples]
    mean = torch.tensor(MEAN).view(1, 3, 1, 1)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    rrc = tv.RandomResizedCrop(224)

    def source():
        while True:
            random.shuffle(items)
            yield from items

    def decode(item):
        path, label = item
        packets = spdl.io.demux_image(path)
        top, left, h, w = rrc.get_params(torch.empty(packets.height, packets.width), rrc.scale, rrc.ratio)
        desc = "crop=%d:%d:%d:%d,scale=224:224:flags=bilinear%s,format=rgb24" % (
            w, h, left, top, ",hflip" if random.random() < 0.5 else "")
        return spdl.io.decode_packets(packets, filter_desc=desc), label

    def collate(batch):
        frames = [f for f, _ in batch]
        x = spdl.io.to_torch(spdl.io.convert_frames(frames)).permute(0, 3, 1, 2).float().div_(255)
        return (x - mean) / std, torch.tensor([label for _, label in batch])

    pipeline = (PipelineBuilder().add_source(source()).pipe(decode, concurrency=threads)
                .aggregate(batch_size).pipe(collate).add_sink(3).build(num_threads=threads))
    with pipeline.auto_stop():
        yield from pipeline


def dali_batches(images_root, batch_size, threads):
    """NVIDIA DALI's CPU pipeline (no GPU): file reader, fused decode +
    random crop (area (0.08, 1), ratio (3/4, 4/3), 10 attempts), bilinear
    resize with antialiasing, flip + normalise into float32 CHW; batches
    handed to torch by copy (DALI owns its CPU buffers)."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch_size, num_threads=threads, device_id=None, prefetch_queue_depth=2)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=images_root, random_shuffle=True, name="Reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                               random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
        images = fn.resize(images, resize_x=224, resize_y=224, interp_type=types.INTERP_LINEAR, antialias=True)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                          mean=[255 * m for m in MEAN], std=[255 * s for s in STD],
                                          mirror=fn.random.coin_flip(probability=0.5))
        return images, labels

    p = pipe()
    p.build()
    while True:
        images, labels = p.run()
        yield torch.from_numpy(np.array(images.as_tensor())), torch.from_numpy(np.array(labels.as_tensor()))


def forever(loader):
    while True:
        for batch in loader:
            yield batch[0], batch[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True, help="the ImageFolder tree")
    parser.add_argument("--packed", required=True, help="the same images packed by stoker")
    parser.add_argument("--seekable", help="also the same images packed with stoker pack --seekable-jpeg")
    parser.add_argument("--batches", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--consumer-ms", type=float, default=0.0,
                        help="also simulate an accelerator step of this many ms per batch and report utilisation")
    parser.add_argument("--prefetch", type=int,
                        help="stoker's prefetch depth (default: automatic); 2 decodes two batches ahead "
                             "into buffers of their own, as the automatic depth did before 2026-12-06")
    parser.add_argument("--json")
    parser.add_argument("--column", type=int, help=argparse.SUPPRESS)  # internal: run this column only
    args = parser.parse_args()
    torch.set_num_threads(1)

    results = []
    column = [0]

    def measure(name, make_batches):
        """One column, in a process of its own: the loader alone, then (with
        --consumer-ms) a fresh one feeding the simulated accelerator step."""
        k = column[0]
        column[0] += 1
        if args.column is not None:
            if k == args.column:
                result = run(name, make_batches, args.batches, args.warmup)
                if args.consumer_ms:
                    result["with_step"] = run("", make_batches, args.batches, args.warmup, args.consumer_ms)
                print("RESULT " + json.dumps(result), flush=True)
                sys.exit(0)
            return
        argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--column", str(k)]
        out = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
        lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
        if out.returncode != 0 or not lines:
            raise SystemExit("column %r failed (exit %d)" % (name, out.returncode))
        results.append(json.loads(lines[-1][len("RESULT "):]))

    def peer_version(module, label):
        try:
            return getattr(__import__(module, fromlist=["__version__"]), "__version__", "?")
        except Exception as error:  # ImportError, or a library it loads is missing
            print("%s column skipped: %s" % (label, str(error).splitlines()[0][:160]))
            return None

    train = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(), tv.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.images, transform=train)
    measure("torch DataLoader (ImageFolder, %d workers)" % args.workers, lambda: forever(
        torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                    persistent_workers=True, drop_last=True)))

    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)])
    sources = [(args.packed, "packed shards"), (args.images, "loose files")]
    if args.seekable:
        sources.append((args.seekable, "seekable pack"))
    for source, label in sources:
        measure("stoker.Loader (%s, %d threads)" % (label, args.workers), lambda source=source: forever(
            stoker.Loader(source, batch_size=args.batch_size, transform=transform, num_threads=args.workers,
                          prefetch=args.prefetch)))

    # Further columns where the peers install and run here.
    if peer_version("spdl.io", "SPDL") is not None:
        measure("SPDL 0.8 (FFmpeg decode + filter, %d threads)" % args.workers,
                lambda: spdl_batches(args.images, args.batch_size, args.workers))
    dali = peer_version("nvidia.dali", "DALI")
    if dali is not None:
        measure("NVIDIA DALI %s CPU pipeline, %d threads" % (dali, args.workers),
                lambda: dali_batches(args.images, args.batch_size, args.workers))

    base = results[0]
    print("%-46s %10s %12s %14s %14s" % ("loader", "images/s", "CPU ms/img", "peak RSS sum", "peak PSS sum"))
    for r in results:
        print("%-46s %10.0f %12.2f %11.0f MiB %11.0f MiB" % (r["loader"], r["images_per_s"], 1000 * r["cpu_s_per_image"],
                                                            r["peak_rss_bytes"] / 2**20, r["peak_pss_bytes"] / 2**20))
    for s in results[1:]:
        if s["loader"].startswith("stoker.Loader (packed") or s["loader"].startswith("stoker.Loader (seekable"):
            print("%s: %.1fx the images/s of torch DataLoader at %.0f%% of its peak memory (PSS), %.0f%% (RSS sum)"
                  % (s["loader"].split(",")[0].replace("stoker.Loader (", "stoker (") + ")", s["images_per_s"] /
                     base["images_per_s"], 100 * s["peak_pss_bytes"] / base["peak_pss_bytes"],
                     100 * s["peak_rss_bytes"] / base["peak_rss_bytes"]))
    if args.consumer_ms:
        print("with a simulated %.0f ms accelerator step per batch of %d (demand: %.0f images/s):"
              % (args.consumer_ms, args.batch_size, args.batch_size * 1000 / args.consumer_ms))
        for r in results:
            w = r["with_step"]
            print("  %-46s accelerator utilization %5.1f%%  (idle %.1f%%)"
                  % (r["loader"], 100 * w["accelerator_utilization"], 100 * (1 - w["accelerator_utilization"])))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
