"""Mixed samples side by side: stoker.Loader(fields=...) against torch's
DataLoader over webdataset with the same decoding, on the same shards.

Each sample: an ImageNet-density JPEG (make_demo_data's photographs,
~90 KB) cropped to 224 and normalised, a PNG mask at the image's size
(decoded whole, mode L), JSON boxes, a 512-float .npy embedding, a caption.
Both run 2 epochs with 2 workers/threads and batch 64 (stoker also with
uint8 batches, normalised by the consumer as a GPU would); the figure is the
second epoch (steady state, page cache warm), and peak memory is the
largest sum of PSS over the run's process tree (DataLoader's workers
included), sampled every 50 ms.

    .venv/bin/python bench/fields_compare.py [--images 1000] [--work /tmp/fields-bench]
"""
import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def demo_jpegs(work, images, photos=None):
    """make_demo_data's photographs under work/demo (made once), sorted."""
    demo = os.path.join(work, "demo")
    if not os.path.isdir(demo):
        per_class = max(1, images // 4)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), demo, "--classes", "4",
                        "--per-class", str(per_class), "--jobs", "2"] + (["--photos", photos] if photos else []),
                       check=True, capture_output=True)
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(demo) for f in fs if f.endswith(".JPEG"))


def index_shards(shards):
    """`stoker index` over every .tar in `shards`."""
    tars = sorted(os.path.join(shards, f) for f in os.listdir(shards) if f.endswith(".tar"))
    subprocess.run([os.environ.get("STOKER_BIN", os.path.join(ROOT, "build", "release", "stoker")), "index"] + tars,
                   check=True, capture_output=True)


def median(xs):
    return sorted(xs)[len(xs) // 2]


def report(results, ours, peer):
    """Prints the medians of `results` ({name: [(rate, pss, rss), ...]})
    and `ours` against `peer`; returns the peer's (rate, pss, rss)."""
    s_rate, s_mem, s_rss = (median([r[i] for r in results[ours]]) for i in (0, 1, 2))
    d_rate, d_mem, d_rss = (median([r[i] for r in results[peer]]) for i in (0, 1, 2))
    print("medians: %s %.1f samples/s, %.0f MiB PSS, %.0f MiB RSS summed; %s %.1f samples/s, %.0f MiB, %.0f MiB" %
          (ours, s_rate, s_mem / 2**20, s_rss / 2**20, peer, d_rate, d_mem / 2**20, d_rss / 2**20))
    print("%s: %.2fx the throughput at %.0f%% of the memory (PSS), %.0f%% (RSS summed)" %
          (ours, s_rate / d_rate, 100 * s_mem / d_mem, 100 * s_rss / d_rss))
    return d_rate, d_mem, d_rss


def write_shards(shards, samples, shard_bytes):
    """Writes `samples` ((key, {ext: bytes}) pairs) as WebDataset tars of
    about `shard_bytes` each into `shards`, then indexes them."""
    os.makedirs(shards, exist_ok=True)
    shard, size, tar = 0, 0, None
    for key, sample in samples:
        if tar is None or size > shard_bytes:
            if tar:
                tar.close()
            tar = tarfile.open(os.path.join(shards, "shard-%06d.tar" % shard), "w")
            shard, size = shard + 1, 0
        for ext, data in sample.items():
            info = tarfile.TarInfo(key + "." + ext)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            size += len(data) + 1024
    if tar:
        tar.close()
    index_shards(shards)


def build(work, images, photos=None):
    shards = os.path.join(work, "shards")
    if os.path.exists(os.path.join(shards, "index.stoker")):
        return shards
    from PIL import Image
    rng = np.random.default_rng(0)

    def samples():
        for i, path in enumerate(demo_jpegs(work, images, photos)):
            jpg = open(path, "rb").read()
            gray = Image.open(io.BytesIO(jpg)).convert("L")
            mask = Image.fromarray((np.asarray(gray) // 64 * 64).astype(np.uint8))
            buf = io.BytesIO()
            mask.save(buf, "PNG")
            boxes = [[float(v) for v in rng.uniform(0, 300, 4)] for _ in range(int(rng.integers(1, 6)))]
            emb = io.BytesIO()
            np.save(emb, rng.standard_normal(512).astype(np.float32))
            yield "%07d" % i, {"jpg": jpg, "seg.png": buf.getvalue(), "cls": b"%d" % (i % 4),
                               "json": json.dumps({"boxes": boxes}).encode(), "npy": emb.getvalue(),
                               "txt": ("a photograph, number %d" % i).encode()}

    write_shards(shards, samples(), 64 << 20)
    return shards


RUN_STOKER = r'''
import sys, time, stoker
T = stoker.transforms
fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                     T.Normalize(T.IMAGENET_MEAN, T.IMAGENET_STD)])),
          "mask": stoker.Image(keys="seg.png", mode="L"), "label": stoker.Int("cls"), "boxes": stoker.Json(),
          "emb": stoker.Array(), "caption": stoker.Text()}
loader = stoker.Loader(sys.argv[1], batch_size=64, num_threads=2, fields=fields, log_epochs=False)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
'''

# The same, with uint8 batches (NHWC) normalised where the model runs: on a
# GPU that is the first op of the step (FFCV and DALI hand over uint8 the
# same way); here the consumer does it on the CPU, in the measured time and
# memory.
RUN_STOKER_UINT8 = r'''
import sys, time, torch, stoker
T = stoker.transforms
fields = {"image": stoker.Image(transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip()])),
          "mask": stoker.Image(keys="seg.png", mode="L"), "label": stoker.Int("cls"), "boxes": stoker.Json(),
          "emb": stoker.Array(), "caption": stoker.Text()}
loader = stoker.Loader(sys.argv[1], batch_size=64, num_threads=2, fields=fields, log_epochs=False, dtype="uint8")
mean = torch.tensor(T.IMAGENET_MEAN).view(1, 3, 1, 1) * 255
std = torch.tensor(T.IMAGENET_STD).view(1, 3, 1, 1) * 255
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        images = batch["image"].permute(0, 3, 1, 2).float().sub_(mean).div_(std)
        assert images.shape == (len(batch["label"]), 3, 224, 224)
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
'''

RUN_DATALOADER = r'''
import io, json, sys, time, glob
import numpy as np, torch, webdataset as wds
import torchvision.transforms as tv
from PIL import Image
transform = tv.Compose([tv.RandomResizedCrop(224), tv.RandomHorizontalFlip(), tv.ToTensor(),
                        tv.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
def decode(s):
    return {"image": transform(Image.open(io.BytesIO(s["jpg"])).convert("RGB")),
            "mask": torch.from_numpy(np.asarray(Image.open(io.BytesIO(s["seg.png"])).convert("L"))[:, :, None].copy()),
            "label": int(s["cls"]), "boxes": json.loads(s["json"]), "emb": torch.from_numpy(np.load(io.BytesIO(s["npy"]))),
            "caption": s["txt"].decode("utf-8")}
def collate(samples):
    return {"image": torch.stack([s["image"] for s in samples]), "mask": [s["mask"] for s in samples],
            "label": torch.tensor([s["label"] for s in samples]), "boxes": [s["boxes"] for s in samples],
            "emb": torch.stack([s["emb"] for s in samples]), "caption": [s["caption"] for s in samples]}
urls = sorted(glob.glob(sys.argv[1] + "/*.tar"))
dataset = wds.WebDataset(urls, shardshuffle=True).shuffle(1000).map(decode)
loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=2, collate_fn=collate,
                                     persistent_workers=True)
for epoch in range(2):
    t, n = time.perf_counter(), 0
    for batch in loader:
        n += len(batch["label"])
    print(epoch, n, time.perf_counter() - t, flush=True)
'''


def tree_memory(pid):
    """(PSS, RSS) of `pid` and all its descendants, summed: PSS counts
    shared pages once, RSS once per process (as `top` shows them)."""
    pss = rss = 0
    try:
        for line in open("/proc/%d/smaps_rollup" % pid):
            if line.startswith("Pss:"):
                pss += int(line.split()[1]) * 1024
            elif line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
    except OSError:
        return 0, 0
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    for c in children:
        p, r = tree_memory(int(c))
        pss, rss = pss + p, rss + r
    return pss, rss


def print_run(name, result):
    rate, pss, rss = result
    print("%-22s %7.1f samples/s, peak memory %6.0f MiB PSS, %6.0f MiB RSS summed" %
          (name, rate, pss / 2**20, rss / 2**20), flush=True)


def run(name, script, *args):
    """Runs `script` with `args` in a fresh Python; (samples/s of its last
    printed epoch, peak PSS of its process tree, peak RSS summed over it)."""
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "build", "release", "python"))
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, args)], stdout=subprocess.PIPE, text=True,
                            env=env)
    peak = [0, 0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            pss, rss = tree_memory(proc.pid)
            peak[0], peak[1] = max(peak[0], pss), max(peak[1], rss)
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    out, _ = proc.communicate()
    done.set()
    if proc.returncode != 0:
        raise SystemExit("%s failed" % name)
    epoch, n, seconds = out.strip().splitlines()[-1].split()
    return int(n) / float(seconds), peak[0], peak[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=1000)
    ap.add_argument("--work", default="/tmp/fields-bench")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each, alternating; medians are compared")
    args = ap.parse_args()
    shards = build(args.work, args.images)
    results = {"stoker": [], "stoker uint8": [], "DataLoader+webdataset": []}
    for _ in range(args.repeats):
        for name, script in [("stoker", RUN_STOKER), ("stoker uint8", RUN_STOKER_UINT8),
                             ("DataLoader+webdataset", RUN_DATALOADER)]:
            result = run(name, script, shards)
            results[name].append(result)
            print_run(name, result)

    d_rate, d_mem, _ = report(results, "stoker", "DataLoader+webdataset")
    u_rate, u_mem = (median([r[i] for r in results["stoker uint8"]]) for i in (0, 1))
    print("stoker, uint8 batches normalised by the consumer: %.1f samples/s, %.0f MiB: %.2fx at %.0f%%" %
          (u_rate, u_mem / 2**20, u_rate / d_rate, 100 * u_mem / d_mem))


if __name__ == "__main__":
    main()
