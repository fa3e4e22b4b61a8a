"""stoker: keep deep-learning GPUs busy.

``stoker.Loader`` replaces a torch DataLoader over a packed dataset: native
threads read, decode (libjpeg-turbo, region of interest, DCT scaling),
augment with torchvision's semantics and normalise straight into reusable
batch buffers, which reach torch as zero-copy tensors.

    import stoker, stoker.transforms as T
    loader = stoker.Loader("imagenet-packed", batch_size=256, shuffle=True, seed=0,
                           transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                                                T.Normalize(mean, std)]))
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for images, labels in loader:
            ...
"""
import logging
import os
import time

from . import _native
from . import transforms

__all__ = ["Loader", "pack", "cuda_status", "StokerError", "CorruptionError", "transforms", "Checkpointer", "Checkpoint",
           "load_checkpoint", "load_latest", "load_safetensors", "list_checkpoints", "restore_rng"]


class StokerError(RuntimeError):
    """An error inside stoker that has no more specific Python type."""


class CorruptionError(StokerError, ValueError):
    """Bytes on storage are not what the format says (names the sample and shard:offset)."""


_native._set_exceptions(StokerError, CorruptionError)

from .checkpoint import (Checkpoint, Checkpointer, list_checkpoints, load_checkpoint, load_latest,  # noqa: E402
                         load_safetensors, parse_size, restore_rng)


def cuda_status():
    """Whether stoker can use CUDA here: {"built_with_cuda", "device_count",
    "reason"} (why not, when device_count is 0). stoker never needs CUDA
    libraries to import: the runtime is linked statically and used only when
    a device is present."""
    return dict(_native.cuda_status())


def _torch():
    import torch  # imported lazily: stoker's own code does not need it
    return torch


_DTYPES = {
    "float32": _native.DType.float32,
    "float16": _native.DType.float16,
    "bfloat16": _native.DType.bfloat16,
    "uint8": _native.DType.uint8,
}


def _dtype_name(dtype):
    if isinstance(dtype, str):
        name = dtype
    else:
        name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError("dtype %r is not supported (float32, float16, bfloat16 or uint8)" % (dtype,))
    return name


def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


class Loader:
    """An iterable of ``(images, labels)`` (or ``(images, labels, indices)``
    with ``with_indices=True``) torch tensors over a packed dataset (a
    folder with ``index.stoker``), or over an ImageFolder tree of loose image
    files (indexed in memory at creation; packed shards read faster).

    ``batch_size`` is per rank, as in DataLoader; ``rank`` and ``world_size``
    default to torchrun's ``RANK`` and ``WORLD_SIZE``. ``len(loader)`` is the
    number of batches this rank yields per epoch. Each ``for`` loop over the
    loader runs one epoch; the next loop runs the next epoch unless
    ``set_epoch`` says otherwise. ``state_dict()`` / ``load_state_dict()``
    resume exactly, also under a different world size with the same global
    batch (``batch_size * world_size``).

    ``device="cuda"`` (or ``"cuda:N"``) yields CUDA tensors on torch's
    current stream, copied on stoker's own stream; ``gpu_preprocess=True``
    also moves the resize, flip, normalisation and dtype conversion to the
    GPU. Without a usable GPU the loader says why and stays on the CPU.

    ``dataset`` may also be a URL (``http://``, ``https://``, ``s3://``):
    shards are read through a local cache (``cache_dir``, default
    ``$STOKER_CACHE_DIR`` or ``~/.cache/stoker``; ``cache_size`` bytes or a
    string such as ``"20GiB"``) that downloads them ahead in the loader's own
    order with ``connections`` parallel transfers and evicts what is needed
    furthest ahead. Use ``order="shard_block"`` so that an epoch's working set
    fits the cache.
    """

    def __init__(self, dataset, batch_size=64, shuffle=True, seed=0, rank=None, world_size=None, transform=None,
                 dtype="float32", layout=None, with_indices=False, drop_last=False, num_threads=None, prefetch=None,
                 order="shuffle", shard_window=None, on_corrupt="error", image_field=None, log_epochs=True,
                 device="cpu", gpu_preprocess=False, cache_dir=None, cache_size="16GiB", connections=8,
                 max_attempts=8, stall_timeout=30.0):
        if transform is None:
            transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                            transforms.Normalize(transforms.IMAGENET_MEAN, transforms.IMAGENET_STD)])
        name = _dtype_name(dtype)
        options = _native.LoaderOptions()
        options.batch_size = int(batch_size)
        options.shuffle = bool(shuffle)
        if order not in ("shuffle", "shard_block", "sequential"):
            raise ValueError("order must be 'shuffle', 'shard_block' or 'sequential', not %r" % (order,))
        options.order = getattr(_native.Order, order)
        options.shard_window = int(shard_window or 0)
        options.seed = int(seed)
        options.drop_last = bool(drop_last)
        options.rank = int(rank) if rank is not None else _env_int("RANK", 0)
        options.world_size = int(world_size) if world_size is not None else _env_int("WORLD_SIZE", 1)
        threads = int(num_threads or 0)
        if threads == 0 and str(device) != "cpu" and cuda_status().get("device_count", 0) > 0:
            # Leave a core to the training thread that launches the GPU's work: on a 16-core H200 machine,
            # 16 decode threads cut ResNet-50's GPU utilisation to 92% where 14 or fewer kept it at 100%.
            threads = max(1, (os.cpu_count() or 2) - 1)
        options.threads = threads
        options.prefetch = int(prefetch or 0)
        if on_corrupt not in ("error", "skip"):
            raise ValueError("on_corrupt must be 'error' or 'skip', not %r" % (on_corrupt,))
        options.on_corrupt = getattr(_native.CorruptPolicy, on_corrupt)
        options.image_field = image_field or ""
        t = transform._options()
        t.dtype = _DTYPES[name]
        if layout is None:
            layout = "NHWC" if name == "uint8" else "NCHW"
        if layout not in ("NCHW", "NHWC"):
            raise ValueError("layout must be 'NCHW' or 'NHWC', not %r" % (layout,))
        t.layout = getattr(_native.Layout, layout)
        options.transform = t
        self._with_indices = with_indices
        self._log_epochs = log_epochs
        remote = _native.RemoteOptions()
        if cache_dir is not None:
            remote.cache_dir = os.fspath(cache_dir)
        remote.cache_size = parse_size(cache_size)
        remote.connections = int(connections)
        remote.max_attempts = int(max_attempts)
        remote.stall_timeout_s = float(stall_timeout)
        self._native = _native.Loader(os.fspath(dataset), options, str(device), bool(gpu_preprocess), remote)
        if self._native.device_note:
            logging.getLogger("stoker").warning(self._native.device_note)
        if self._native.loose_files:
            logging.getLogger("stoker").info(
                "%s has no index.stoker: reading it as an ImageFolder of loose files (stoker pack makes it faster)",
                os.fspath(dataset))
        self._last_epoch_summary = None
        self._mark_epoch_start()

    def _mark_epoch_start(self):
        # The loader prepares batches from its creation and runs ahead into
        # the next epoch, so an epoch's wall time counts from when its work
        # could begin (creation, the previous epoch's end, or a reset), not
        # from the first next(): that would overstate images/s.
        self._epoch_start_time = time.perf_counter()
        self._epoch_start_stats = self._native.stats()

    def __len__(self):
        return self._native.batches_per_epoch

    @property
    def gpu_preprocess(self):
        """True when the GPU finishes each batch: the CPU decodes the crops
        (uint8) and one fused kernel resizes, flips, normalises and converts
        them on the device (``gpu_preprocess=True`` with a CUDA device)."""
        return self._native.gpu_preprocess

    @property
    def device(self):
        """Where batches arrive: "cpu", or "cuda:N" (a CUDA request falls back
        to "cpu", with a logged warning, where CUDA is unavailable)."""
        return self._native.device

    def __iter__(self):
        from torch.utils.dlpack import from_dlpack
        on_device = self._native.device != "cpu"
        while True:
            epoch = self._native.epoch
            if on_device:
                # Batches are copied on stoker's own stream; torch's current
                # stream waits on an event (no host synchronisation).
                torch = _torch()
                stream = torch.cuda.current_stream(torch.device(self._native.device))
                item = self._native.next(stream.cuda_stream)
            else:
                item = self._native.next()
            if item is None:
                wall = time.perf_counter() - self._epoch_start_time
                stats = self._native.stats().since(self._epoch_start_stats)
                self._last_epoch_summary = "epoch %d: %s" % (epoch, stats.summary(wall))
                if self._log_epochs:
                    logging.getLogger("stoker").info(self._last_epoch_summary)
                self._mark_epoch_start()
                return
            images, labels = from_dlpack(item[0]), from_dlpack(item[1])
            if on_device:
                labels = labels.to(images.device, non_blocking=True)
            if not self._with_indices:
                yield images, labels
                continue
            indices = from_dlpack(item[2])
            if on_device:
                indices = indices.to(images.device, non_blocking=True)
            yield images, labels, indices

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its beginning (its order is a function of seed and epoch)."""
        if int(epoch) != self._native.epoch:
            self._mark_epoch_start()
        self._native.set_epoch(int(epoch))

    @property
    def epoch(self):
        return self._native.epoch

    @property
    def rank(self):
        return self._native.rank

    @property
    def world_size(self):
        return self._native.world_size

    def state_dict(self):
        """Where the loader is: enough to resume exactly (a small dict of ints)."""
        return dict(self._native.state())

    def load_state_dict(self, state):
        self._native.restore(dict(state))
        self._mark_epoch_start()

    def remote_stats(self):
        """Remote datasets: the cache's figures (hits, misses, downloads,
        bytes_downloaded, evictions, retries, adopted, over_capacity, wait_s);
        all zero for a local dataset."""
        return dict(self._native.remote_stats())

    def stats(self):
        """Counters since creation: batches, samples, bytes read, consumer wait
        and per-stage busy seconds, corrupt samples skipped; with a CUDA
        device also "copy_s" (host-to-device copy time, from CUDA events) and
        "copied_bytes"."""
        d = self._native.stats().as_dict()
        for k, v in self._native.device_stats().items():
            d["device_" + k if k == "batches" else k] = v
        return d

    def summary(self):
        """A one-line summary of the last complete epoch (logged at its end
        to the "stoker" logger), or of everything so far before that."""
        if self._last_epoch_summary is not None:
            return self._last_epoch_summary
        wall = time.perf_counter() - self._epoch_start_time
        return self._native.stats().since(self._epoch_start_stats).summary(wall)


def pack(source, out, shard_size=64 << 20, overwrite=False):
    """Packs an ImageFolder tree, a CSV/JSONL manifest or tar shards into
    indexed shards (see `stoker pack --help`). Returns a summary dict."""
    return _native.pack(os.fspath(source), os.fspath(out), int(shard_size), bool(overwrite))
