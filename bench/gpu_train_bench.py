"""The loader feeding a real training step on a GPU: torchvision ResNet-50,
forward + backward + SGD step under bfloat16 autocast, batch 256, fed by
stoker.Loader(device="cuda") (CPU preprocessing, and gpu_preprocess=True)
and by torch DataLoader (ImageFolder,
num_workers = cores, pin_memory) on the same JPEGs with the same transform.

GPU idle % comes from CUDA events around each step on the compute stream:
idle = 1 - (sum of step times) / (first step start .. last step end), the
GPU's time between steps. A launch-bound step idles inside the step, which
events cannot see: where NVML is present, GPU utilisation is also sampled
every 50 ms, and that is the figure to trust. Prints one line per loader and writes JSON with --json.

    PYTHONPATH=build/gpu/python python3 bench/gpu_train_bench.py --images IMAGES --packed PACKED
"""
import argparse
import json
import os
import threading
import time

import torch
import torchvision
import torchvision.transforms as tv

import stoker
import stoker.transforms as T

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class NvmlSampler:
    """Mean GPU utilisation (%) reported by NVML while active, or None."""

    def __init__(self):
        self.samples, self._stop, self._thread = [], threading.Event(), None
        try:
            import pynvml
            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
            self._nvml = pynvml
        except Exception:
            self._nvml = None

    def __enter__(self):
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            self.samples.append(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu)

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def mean(self):
        return sum(self.samples) / len(self.samples) if self.samples else None


def train(name, batches, model, optimizer, steps, warmup, to_device):
    events, next_s = [], []
    it = iter(batches)
    sampler = NvmlSampler()
    wall_start = None
    for i in range(warmup + steps):
        if i == warmup:
            torch.cuda.synchronize()
            wall_start = time.perf_counter()
            sampler.__enter__()
        t_next = time.perf_counter()
        x, y = next(it)
        x, y = to_device(x, y)
        if i >= warmup:
            next_s.append(time.perf_counter() - t_next)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        if i >= warmup:
            events.append((start, end))
    torch.cuda.synchronize()
    wall = time.perf_counter() - wall_start
    sampler.__exit__()
    busy_ms = sum(s.elapsed_time(e) for s, e in events)
    span_ms = events[0][0].elapsed_time(events[-1][1])
    batch = x.shape[0]
    result = {"loader": name, "steps": steps, "batch": batch, "images_per_s": steps * batch / wall,
              "step_compute_ms": busy_ms / steps, "gpu_idle_percent": 100 * (1 - busy_ms / span_ms),
              "nvml_utilization_percent": sampler.mean(), "host_next_ms": 1000 * sum(next_s) / steps,
              "gaps_ms": [round(events[k][0].elapsed_time(events[k + 1][0]) - events[k][0].elapsed_time(events[k][1]), 2)
                          for k in range(min(8, steps - 1))]}
    print("%-44s %7.0f img/s  step %6.1f ms  GPU idle between steps %5.1f%%  NVML util %s  host in next() %.1f ms" % (
        name, result["images_per_s"], result["step_compute_ms"], result["gpu_idle_percent"],
        "n/a" if result["nvml_utilization_percent"] is None else "%.0f%%" % result["nvml_utilization_percent"],
        result["host_next_ms"]), flush=True)
    return result


def check_parity(packed, transform, batches=4):
    """The same batches (same seed and order) on the CPU, copied to the GPU,
    and finished on the GPU: copies must be identical; GPU finishing within
    about one uint8 level (after undoing the normalisation)."""
    def take(**kw):
        loader = stoker.Loader(packed, batch_size=64, seed=1, transform=transform, num_threads=4, log_epochs=False, **kw)
        out = []
        for i, (x, _) in enumerate(loader):
            out.append(x.float().cpu())
            if i + 1 == batches:
                break
        return torch.cat(out)
    cpu = take()
    copied = take(device="cuda")
    finished = take(device="cuda", gpu_preprocess=True)
    std = torch.tensor(STD).view(1, 3, 1, 1)
    levels = ((finished - cpu).abs() * std * 255)
    return {"copied_identical": bool(torch.equal(cpu, copied)), "gpu_finished_max_levels": levels.max().item(),
            "gpu_finished_mean_levels": levels.mean().item()}


def forever(loader):
    while True:
        for batch in loader:
            yield batch[0], batch[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True)
    parser.add_argument("--packed", required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count(), help="DataLoader workers (default: cores)")
    parser.add_argument("--stoker-threads", type=int, default=None,
                        help="stoker threads (default: stoker's own, one fewer than the cores on a GPU)")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_train_bench: no CUDA device")
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")

    def make_model():
        torch.manual_seed(0)
        model = torchvision.models.resnet50(num_classes=1000).to(device, memory_format=torch.channels_last)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    results = []
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)])
    # NHWC output is torch's channels_last once permuted: no layout pass on the GPU.
    loader = stoker.Loader(args.packed, batch_size=args.batch_size, transform=transform,
                           num_threads=args.stoker_threads, device="cuda", layout="NHWC", log_epochs=False)
    model, opt = make_model()
    results.append(train("stoker.Loader(device='cuda'), %d threads" % loader.stats()["threads"], forever(loader), model, opt,
                         args.steps, args.warmup,
                         lambda x, y: (x.permute(0, 3, 1, 2), y)))
    stats = loader.stats()
    results[-1]["copy_s"] = stats.get("copy_s")
    results[-1]["consumer_wait_s"] = stats.get("wait_s")
    del loader

    # The GPU finishes preprocessing: the CPU only decodes the crops.
    loader = stoker.Loader(args.packed, batch_size=args.batch_size, transform=transform,
                           num_threads=args.stoker_threads, device="cuda", layout="NHWC", gpu_preprocess=True,
                           log_epochs=False)
    model, opt = make_model()
    results.append(train("stoker.Loader(device='cuda', gpu_preprocess)", forever(loader), model, opt, args.steps,
                         args.warmup, lambda x, y: (x.permute(0, 3, 1, 2), y)))
    del loader

    train_tf = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(), tv.Normalize(MEAN, STD)])
    dataset = torchvision.datasets.ImageFolder(args.images, transform=train_tf)
    dl = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                     pin_memory=True, persistent_workers=True, drop_last=True, prefetch_factor=4)
    model, opt = make_model()
    results.append(train("torch DataLoader (%d workers, pin_memory)" % args.workers, forever(dl), model, opt,
                         args.steps, args.warmup,
                         lambda x, y: (x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last),
                                       y.to(device, non_blocking=True))))
    # Last, so that its loaders cannot colour the timed runs.
    parity = check_parity(args.packed, transform)
    print("parity with the CPU path: copied batches identical: %s; GPU-finished: max %.2f, mean %.3f uint8 levels"
          % (parity["copied_identical"], parity["gpu_finished_max_levels"], parity["gpu_finished_mean_levels"]),
          flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"parity": parity, "runs": results}, f, indent=2)


if __name__ == "__main__":
    main()
