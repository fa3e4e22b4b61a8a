"""A dataset larger than the cache, read remotely: stoker beside MosaicML
Streaming, on the same images, shards, servers, network and cache sizes.

One ImageFolder tree is packed twice into shards of the same size: by
`stoker pack` (WebDataset tars plus the index) and by Mosaic's MDSWriter
(columns jpg: bytes, cls: int). nginx serves stoker's shards over HTTP; moto's
S3 server holds both; each server sits behind our proxy, which adds a latency
to every request and caps the bandwidth of all transfers together (a bucket
in another region). Each configuration runs in a fresh process with an empty
cache, two epochs, the same work per image: JPEG decode, RandomResizedCrop
224, horizontal flip, normalise to float32, batches of 64, two CPU workers
(stoker: two loader threads, order="auto"; Mosaic: StreamingDataset with
shuffle_algo="py1s", num_canonical_nodes=1 and cache_limit, under a torch
DataLoader, decoding with PIL and transforming with torchvision; two worker
processes locally, one remotely: with two, Mosaic 0.13 read corrupt samples
behind the 30 ms proxy in every run, see --mosaic-workers). Reported per epoch: images/s, bytes the proxy sent as a
multiple of the dataset, and the peak memory of the process tree (RSS summed
over the process and its workers, sampled every 0.1 s). The same loaders on
the local copies give each its local speed.

Mosaic needs its own interpreter (its dependencies are not stoker's; torch
comes from Debian through --system-site-packages):

    /usr/bin/python3 -m venv --system-site-packages /var/tmp/mosaic-venv
    /var/tmp/mosaic-venv/bin/pip install --no-deps mosaicml-streaming==0.13.0
    /var/tmp/mosaic-venv/bin/pip install boto3 'xxhash<4' zstd tqdm catalogue python-snappy 'transformers<5' 'numpy<2.2'
    PYTHONPATH=build/release/python .venv/bin/python bench/remote_cache_bench.py --images DIR \\
        --mosaic-python /var/tmp/mosaic-venv/bin/python
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))

BUCKET = "bench"
S3_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1"}


# ---- the workers: one loader, two epochs, a line per epoch ---------------------------------------------------

def torchvision_transform():
    import torchvision.transforms as T
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                      T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


def run_stoker(location, cache_dir, cache_bytes, epochs, batch_size, order):
    import stoker
    kw = {} if cache_bytes is None else {"cache_dir": cache_dir, "cache_size": cache_bytes}
    if order != "auto":
        kw["order"] = order  # (stoker builds before order="auto" know no other)
    loader = stoker.Loader(location, batch_size=batch_size, num_threads=2, log_epochs=False, **kw)
    st = loader.stats()
    print(json.dumps({"start": True, "order": st.get("order", order), "shard_window": st["shard_window"],
                      "prefetch": st["prefetch"], "predicted": st.get("predicted_epoch_download_bytes")}),
          flush=True)
    for epoch in range(epochs):
        start, n = time.perf_counter(), 0
        for images, labels in loader:
            n += len(labels)
        print(json.dumps({"epoch": epoch, "images": n, "seconds": time.perf_counter() - start}), flush=True)


def run_mosaic(location, cache_dir, cache_bytes, epochs, batch_size, workers):
    import io

    import torch
    from PIL import Image
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # what a killed earlier run left in /dev/shm
    transform = torchvision_transform()

    class Images(StreamingDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            return transform(Image.open(io.BytesIO(sample["jpg"])).convert("RGB")), sample["cls"]

    remote, local = (location, cache_dir) if location.startswith("s3://") else (None, location)
    dataset = Images(remote=remote, local=local, shuffle=True, shuffle_algo="py1s", num_canonical_nodes=1,
                     shuffle_seed=0, batch_size=batch_size, cache_limit=cache_bytes)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=workers, persistent_workers=True)
    print(json.dumps({"start": True}), flush=True)
    for epoch in range(epochs):
        start, n = time.perf_counter(), 0
        for images, labels in loader:
            n += len(labels)
        print(json.dumps({"epoch": epoch, "images": n, "seconds": time.perf_counter() - start}), flush=True)


def write_mds(images, out, shard_bytes):
    from streaming import MDSWriter
    classes = sorted(p.name for p in pathlib.Path(images).iterdir() if p.is_dir())
    with MDSWriter(out=str(out), columns={"jpg": "bytes", "cls": "int"}, size_limit=shard_bytes) as writer:
        for label, name in enumerate(classes):
            for path in sorted((pathlib.Path(images) / name).rglob("*")):
                if path.is_file() and path.suffix.lower() in (".jpg", ".jpeg"):
                    writer.write({"jpg": path.read_bytes(), "cls": label})


# ---- the driver ------------------------------------------------------------------------------------------------

def tree_rss(pid):
    import psutil
    try:
        proc = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
    except psutil.Error:
        return 0


def measure(args, system, location, cache_bytes, proxy, dataset_bytes, env):
    """Runs one configuration in a fresh process; per epoch: images/s, bytes
    the proxy sent / dataset, and the process tree's peak RSS."""
    python = args.mosaic_python if system == "mosaic" else sys.executable
    cache_dir = tempfile.mkdtemp(prefix="cache-", dir=args.work)
    shutil.rmtree(cache_dir)
    cmd = [python, __file__, "--worker", system, "--location", location, "--cache-dir", cache_dir,
           "--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--stoker-order", args.stoker_order,
           "--mosaic-workers",
           str(args.mosaic_workers if location.startswith("s3://") else args.mosaic_local_workers)]
    if cache_bytes is not None:
        cmd += ["--cache-bytes", str(cache_bytes)]
    errors = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True, env=env)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            done.wait(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rows, start_info = [], {}
    sent = proxy.bytes_sent if proxy else 0
    for line in proc.stdout:
        record = json.loads(line)
        if record.get("start"):
            start_info = record
            continue
        now = proxy.bytes_sent if proxy else 0
        rows.append({"epoch": record["epoch"], "images": record["images"],
                     "images_per_s": record["images"] / record["seconds"],
                     "downloaded_x_dataset": (now - sent) / dataset_bytes, "peak_rss_bytes": peak[0]})
        sent = now
    done.set()
    shutil.rmtree(cache_dir, ignore_errors=True)
    result = {"system": system, "location": location, "cache_bytes": cache_bytes, "epochs": rows, **start_info}
    if proc.wait() != 0:
        errors.seek(0)
        lines = [line.strip() for line in errors if line.strip()]
        result["failed"] = lines[-1] if lines else "exit status %d" % proc.returncode
    return result


def measure_with_retries(args, *what):
    """A run that fails is recorded and tried again, up to --attempts times."""
    failures = []
    for _ in range(args.attempts):
        result = measure(args, *what)
        if "failed" not in result:
            break
        failures.append(result["failed"])
        print("  failed: %s" % result["failed"], flush=True)
    result["failures"] = failures
    return result


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", help="ImageFolder tree of JPEGs to pack")
    p.add_argument("--stoker", default=str(ROOT / "build" / "release" / "stoker"))
    p.add_argument("--mosaic-python", default=sys.executable, help="a Python with mosaicml-streaming")
    p.add_argument("--shard-size", default="8MiB")
    p.add_argument("--latency-ms", type=float, default=30)
    p.add_argument("--bandwidth-mb", type=float, default=100, help="MB/s for all transfers together")
    p.add_argument("--caches", default="0.25,0.5,1.0", help="cache sizes as fractions of the dataset")
    p.add_argument("--systems", default="stoker-http,stoker-s3,mosaic-s3")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--attempts", type=int, default=3, help="tries per configuration (a failed run is reported)")
    p.add_argument("--mosaic-workers", type=int, default=1,
                   help="DataLoader workers for Mosaic's remote runs (with 2, Mosaic 0.13 read corrupt samples "
                        "behind the 30 ms proxy: IndexError / UnidentifiedImageError, every run)")
    p.add_argument("--mosaic-local-workers", type=int, default=2, help="DataLoader workers for Mosaic's local run")
    p.add_argument("--stoker-order", default="auto", help="stoker's order (auto, shard_block, shuffle)")
    p.add_argument("--work", default="/var/tmp/stoker-remote-cache-bench")
    p.add_argument("--json", help="write the results here")
    # A worker (internal).
    p.add_argument("--worker", choices=["stoker", "mosaic", "write-mds"], help=argparse.SUPPRESS)
    p.add_argument("--location", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    p.add_argument("--cache-bytes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--shard-bytes", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "stoker":
        return run_stoker(args.location, args.cache_dir, args.cache_bytes, args.epochs, args.batch_size,
                          args.stoker_order)
    if args.worker == "mosaic":
        return run_mosaic(args.location, args.cache_dir, args.cache_bytes, args.epochs, args.batch_size,
                          args.mosaic_workers)
    if args.worker == "write-mds":
        return write_mds(args.images, args.out, args.shard_bytes)
    if not args.images:
        p.error("--images is required")

    import remote_servers
    import stoker
    shard_bytes = stoker.parse_size(args.shard_size)
    work = pathlib.Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    args.work = str(work)
    packed, mds = work / "packed", work / "mds"
    subprocess.run([args.stoker, "pack", args.images, str(packed), "--shard-size", args.shard_size], check=True,
                   capture_output=True)
    with_mosaic = any(s.startswith("mosaic") for s in args.systems.split(","))
    mds.mkdir()
    if with_mosaic:
        subprocess.run([args.mosaic_python, __file__, "--worker", "write-mds", "--images", args.images, "--out",
                        str(mds), "--shard-bytes", str(shard_bytes)], check=True)
    dataset_bytes = sum(s.stat().st_size for s in packed.glob("*.tar"))
    mds_bytes = sum(s.stat().st_size for s in mds.glob("*.mds"))
    print("dataset: %d stoker shards, %.1f MB; %d Mosaic shards, %.1f MB; %.0f ms per request, %.0f MB/s"
          % (len(list(packed.glob("*.tar"))), dataset_bytes / 1e6, len(list(mds.glob("*.mds"))), mds_bytes / 1e6,
             args.latency_ms, args.bandwidth_mb), flush=True)

    nginx = remote_servers.Nginx(packed)
    s3 = remote_servers.MotoS3()
    s3.upload_folder(BUCKET, "stoker", packed)
    if with_mosaic:
        s3.upload_folder(BUCKET, "mds", mds)
    http_proxy = remote_servers.FaultProxy(nginx.url, latency_s=args.latency_ms / 1000,
                                           bandwidth=args.bandwidth_mb * 1e6)
    s3_proxy = remote_servers.FaultProxy(s3.url, latency_s=args.latency_ms / 1000, bandwidth=args.bandwidth_mb * 1e6)
    env = dict(os.environ, **S3_ENV, AWS_ENDPOINT_URL=s3_proxy.url, S3_ENDPOINT_URL=s3_proxy.url)
    results = []
    try:
        systems = args.systems.split(",")
        local = {"stoker": measure_with_retries(args, "stoker", str(packed), None, None, dataset_bytes, env)}
        if with_mosaic:
            local["mosaic"] = measure_with_retries(args, "mosaic", str(mds), None, None, mds_bytes, env)
        for name, r in local.items():
            print("%s local: %s images/s" % (name, ", ".join("%.0f" % e["images_per_s"] for e in r["epochs"])),
                  flush=True)
        for fraction in map(float, args.caches.split(",")):
            for system in systems:
                kind, transport = system.split("-")
                size = mds_bytes if kind == "mosaic" else dataset_bytes
                cache = int(size * fraction)
                location = ("%s/" % http_proxy.url if transport == "http"
                            else "s3://%s/%s" % (BUCKET, "mds" if kind == "mosaic" else "stoker"))
                proxy = http_proxy if transport == "http" else s3_proxy
                r = measure_with_retries(args, kind, location, cache, proxy, size, env)
                r.update(system=system, cache_fraction=fraction)
                results.append(r)
                base = local[kind]["epochs"]
                if "failed" in r:
                    print("cache %3.0f%% %-12s failed %d times" % (100 * fraction, system, len(r["failures"])))
                    continue
                print("cache %3.0f%% %-12s %s" % (100 * fraction, system, " | ".join(
                    "epoch %d: %4.0f img/s (%3.0f%% of local), %.2fx downloaded, peak %.0f MB"
                    % (e["epoch"], e["images_per_s"], 100 * e["images_per_s"] / base[i]["images_per_s"],
                       e["downloaded_x_dataset"], e["peak_rss_bytes"] / 1e6) for i, e in enumerate(r["epochs"]))),
                      flush=True)
    finally:
        http_proxy.close()
        s3_proxy.close()
        nginx.close()
        s3.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"dataset_bytes": dataset_bytes, "mds_bytes": mds_bytes, "local": local, "remote": results,
                       "latency_ms": args.latency_ms, "bandwidth_mb_per_s": args.bandwidth_mb}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
