"""JPEG decoding on the GPU, side by side on one machine (part "decode" of
scripts/gpu-check):

1. decode throughput without a model: stoker.Loader(decode="gpu") (nvJPEG,
   hardware decoder where the GPU has one, then the fused kernel), stoker's
   CPU decode finished on the GPU, and torchvision's batched
   decode_jpeg(device="cuda") on the same files' bytes;
2. parity: decode="gpu" against the CPU decode path, same seed and order
   (max and mean difference in uint8 levels), and the routing counts;
3. training: ResNet-18 (bf16 autocast, channels_last, batch 256) fed by
   stoker CPU decode, stoker GPU decode (with and without stage_ahead: the
   decoder's host work beside or inside next()), torchvision's GPU path (DataLoader
   workers read the bytes; batched decode_jpeg on CUDA + transforms.v2 on
   CUDA tensors), and torch DataLoader (CPU decode), reporting GPU idle %.

    PYTHONPATH=build/gpu/python python3 bench/gpu_decode_bench.py --images IMAGES --packed PACKED --json OUT.json
"""
import argparse
import json
import os
import sys
import time

import torch
import torchvision
import torchvision.transforms as tv

import stoker
import stoker.transforms as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_train_bench import MEAN, STD, forever, train  # noqa: E402


def stoker_loader(packed, batch, decode, transform, **kw):
    return stoker.Loader(packed, batch_size=batch, transform=transform, device="cuda", layout="NHWC",
                         gpu_preprocess=True, decode=decode, log_epochs=False, **kw)


def throughput(batches, count, warmup=3):
    it = iter(batches)
    for _ in range(warmup):
        next(it)
    torch.cuda.synchronize()
    start, images = time.perf_counter(), 0
    for _ in range(count):
        x = next(it)[0]
        images += len(x) if isinstance(x, list) else x.shape[0]
    torch.cuda.synchronize()
    return images / (time.perf_counter() - start)


def torchvision_gpu_decode(files, batch):
    """Batched decode_jpeg on the GPU over bytes already in memory."""
    data = [torchvision.io.read_file(p) for p in files]
    chunks = [data[i:i + batch] for i in range(0, len(data) - batch + 1, batch)]

    def gen():
        while True:
            for c in chunks:
                out = torchvision.io.decode_jpeg(c, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
                yield (out,)
    return gen()


class FileBytes(torch.utils.data.Dataset):
    def __init__(self, samples):
        self.samples = samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        return torchvision.io.read_file(path), label


def collate_bytes(items):
    return [x for x, _ in items], torch.tensor([y for _, y in items])


def torchvision_gpu_pipeline(samples, batch, workers):
    """torchvision's own GPU path: bytes from DataLoader workers, batched
    decode_jpeg on CUDA, transforms.v2 on each CUDA image, stack, normalise."""
    from torchvision.transforms import v2
    dl = torch.utils.data.DataLoader(FileBytes(samples), batch_size=batch, shuffle=True, num_workers=workers,
                                     collate_fn=collate_bytes, persistent_workers=True, drop_last=True,
                                     prefetch_factor=4)
    augment = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    mean = torch.tensor(MEAN, device="cuda").view(1, 3, 1, 1) * 255
    std = torch.tensor(STD, device="cuda").view(1, 3, 1, 1) * 255

    def gen():
        while True:
            for data, labels in dl:
                images = torchvision.io.decode_jpeg(data, device="cuda", mode=torchvision.io.ImageReadMode.RGB)
                x = torch.stack([augment(im) for im in images]).float()
                x = ((x - mean) / std).contiguous(memory_format=torch.channels_last)
                yield x, labels
    return gen()


def parity(packed, transform, batches=4, other=None):
    """decode="gpu" against the CPU decode; with `other` (a seekable pack of
    the same images), decode="gpu" there against decode="gpu" here: the
    regions' own JPEGs against the whole files."""
    def take(decode, where=packed):
        loader = stoker_loader(where, 64, decode, transform, seed=1, num_threads=4)
        out = []
        for i, (x, _) in enumerate(loader):
            out.append(x.float().cpu())
            if i + 1 == batches:
                break
        return torch.cat(out), loader.stats()
    std = torch.tensor(STD).view(1, 1, 1, 3)  # NHWC
    if other is not None:
        whole, whole_stats = take("gpu")
        regions, stats = take("gpu", other)
        levels = (regions - whole).abs() * std * 255
        per_sample = lambda s: s.get("bytes_read", 0) / max(s.get("samples_read") or 1, 1)
        return {"max_levels": levels.max().item(), "mean_levels": levels.mean().item(),
                "seekable_decodes": stats.get("seekable_decodes"), "seekable_fallbacks": stats.get("seekable_fallbacks"),
                "decoded_on_device": stats.get("decoded_on_device"),
                # The seekable pack's JPEGs read in part (their heads and the crops' MCU rows).
                "seekable_part_reads": stats.get("seekable_part_reads"),
                "seekable_part_rereads": stats.get("seekable_part_rereads"),
                "bytes_read_per_sample": per_sample(stats), "plain_bytes_read_per_sample": per_sample(whole_stats)}
    cpu, _ = take("cpu")
    gpu, stats = take("gpu")
    levels = (gpu - cpu).abs() * std * 255
    return {"max_levels": levels.max().item(), "mean_levels": levels.mean().item(),
            "decoder": stats.get("decoder"), "decoded_on_device": stats.get("decoded_on_device"),
            "decoded_on_hardware": stats.get("decoded_on_hardware"),
            "decoded_on_cpu_by_reason": stats.get("decoded_on_cpu_by_reason"),
            "decode_no_room": stats.get("decode_no_room"), "decode_batch_failures": stats.get("decode_batch_failures"),
            "decode_cpu_after_error": stats.get("decode_cpu_after_error")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True)
    parser.add_argument("--packed", required=True)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--decode-batches", type=int, default=20)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--seekable", help="a `stoker pack --seekable-jpeg` pack of the same images: decode='gpu' "
                        "from it (each crop's intervals only) beside the plain pack")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_decode_bench: no CUDA device")
    torch.backends.cudnn.benchmark = True
    result = {"decode_images_per_s": {}, "runs": []}
    transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.Normalize(MEAN, STD)])

    # 1. Decode (+ crop/resize/normalise) throughput, no model.
    samples = torchvision.datasets.ImageFolder(args.images).samples
    variants = [("stoker decode='gpu'", lambda: stoker_loader(args.packed, args.batch_size, "gpu", transform)),
                ("stoker decode='cpu', gpu_preprocess",
                 lambda: stoker_loader(args.packed, args.batch_size, "cpu", transform))]
    if args.seekable:
        variants += [("stoker decode='gpu', seekable pack",
                      lambda: stoker_loader(args.seekable, args.batch_size, "gpu", transform)),
                     ("stoker decode='cpu', gpu_preprocess, seekable pack",
                      lambda: stoker_loader(args.seekable, args.batch_size, "cpu", transform))]
    for name, make in variants:
        loader = make()
        rate = throughput(forever(loader), args.decode_batches)
        result["decode_images_per_s"][name] = rate
        print("%-44s %8.0f img/s  (%s)" % (name, rate, loader.decoder), flush=True)
        del loader
    rate = throughput(torchvision_gpu_decode([p for p, _ in samples[:args.batch_size * 8]], args.batch_size),
                      args.decode_batches)
    result["decode_images_per_s"]["torchvision decode_jpeg(device='cuda'), decode only"] = rate
    print("%-44s %8.0f img/s" % ("torchvision decode_jpeg(cuda), decode only", rate), flush=True)

    # 2. Parity and routing.
    result["parity"] = parity(args.packed, transform)
    print("parity, decode='gpu' vs CPU decode:", json.dumps(result["parity"]), flush=True)
    if args.seekable:
        result["seekable_parity"] = parity(args.packed, transform, other=args.seekable)
        print("parity, decode='gpu' from the seekable pack vs the plain pack:", json.dumps(result["seekable_parity"]),
              flush=True)

    # 3. Training a lighter model.
    def make_model():
        torch.manual_seed(0)
        model = torchvision.models.resnet18(num_classes=1000).to("cuda", memory_format=torch.channels_last)
        return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    nhwc = lambda x, y: (x.permute(0, 3, 1, 2), y)  # noqa: E731
    for name, decode, stage in (("stoker CPU decode (gpu_preprocess)", "cpu", True), ("stoker GPU decode", "gpu", True),
                                ("stoker GPU decode, stage_ahead=False", "gpu", False)):
        loader = stoker_loader(args.packed, args.batch_size, decode, transform, stage_ahead=stage)
        model, opt = make_model()
        result["runs"].append(train(name, forever(loader), model, opt, args.steps, args.warmup, nhwc))
        result["runs"][-1]["decoder"] = loader.decoder
        del loader
    model, opt = make_model()
    result["runs"].append(train("torchvision GPU decode + v2 on CUDA (%d workers)" % args.workers,
                                torchvision_gpu_pipeline(samples, args.batch_size, args.workers), model, opt,
                                args.steps, args.warmup, lambda x, y: (x, y.to("cuda", non_blocking=True))))
    train_tf = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(), tv.Normalize(MEAN, STD)])
    dl = torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(args.images, transform=train_tf),
                                     batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                                     pin_memory=True, persistent_workers=True, drop_last=True, prefetch_factor=4)
    model, opt = make_model()
    result["runs"].append(train("torch DataLoader (%d workers, pin_memory)" % args.workers, forever(dl), model, opt,
                                args.steps, args.warmup,
                                lambda x, y: (x.to("cuda", non_blocking=True).contiguous(
                                    memory_format=torch.channels_last), y.to("cuda", non_blocking=True))))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
