"""stoker.Loader: the image and field loader's Python face over the native
loader (batches as zero-copy tensors, epochs and passes, resumption, stats)."""
import logging
import os
import time

from . import _native, _params, _passes, _process, _summary, transforms
from . import fields as _fields
from ._nvjpeg import find_nvjpeg as _find_nvjpeg
from ._text import counted
from .checkpoint import parse_size


def _torch():
    import torch  # imported lazily: stoker's own code does not need it
    return torch


class Loader:
    """An iterable of ``(images, labels)`` (or ``(images, labels, indices)``
    with ``with_indices=True``) torch tensors, or with ``fields={name: spec}``
    (``stoker.Image``, ``Int``, ``Float``, ``Array``, ``Text``, ``Json``,
    ``Bytes``; see ``stoker.fields``) a dict per batch, over a packed dataset (a
    folder with ``index.stoker``), or over an ImageFolder tree of loose image
    files (indexed in memory at creation; packed shards read faster).
    ``transform`` is a ``stoker.transforms.Compose`` (torchvision's names and
    arguments, compiled natively); ``batch_transform`` (such as
    ``stoker.transforms.MixUp`` or ``CutMix``) maps each ``(images, labels)``
    batch, on its device, before it is yielded.

    ``batch_size`` is per rank, as in DataLoader (64 by default); ``rank``
    and ``world_size`` default to torchrun's ``RANK`` and ``WORLD_SIZE``.
    For elastic training give ``global_batch_size`` instead: every global
    batch has that many samples whatever the world size, split so that
    ranks differ by at most one sample, nothing padded (each sample exactly
    once per epoch; the last batch is short), and ``reshard()`` moves the
    loader to a new rank and world size without restarting it
    (``min_world_size``, default ``$STOKER_ELASTIC_MIN_WORLD_SIZE`` or the
    world size at creation, sizes its buffers). ``len(loader)`` is the
    number of batches this rank yields per epoch. Each ``for`` loop over the
    loader (each ``iter()``) runs one epoch; the next loop runs the next
    epoch unless ``set_epoch`` says otherwise, also after a loop that
    stopped early (``break``, ``islice``, a ``next(iter(loader))`` peek), as
    with DataLoader. ``state_dict()`` / ``load_state_dict()`` resume exactly
    (the next loop goes on from the restored position), also under a
    different world size with the same global batch (``batch_size * world_size``).

    ``device="cuda"`` (or ``"cuda:N"``) yields CUDA tensors on torch's
    current stream, copied on stoker's own stream; ``gpu_preprocess=True``
    also moves the resize, flip, normalisation and dtype conversion to the
    GPU. Without a usable GPU the loader says why and stays on the CPU.
    With ``fields=``, ``device="cuda"`` moves each dict batch's tensors
    (through pinned memory, on stoker's own stream) and leaves its lists on
    the host; decoding stays on the CPU.
    ``num_threads="auto"`` (or ``prefetch="auto"``) lets the loader tune
    its threads and prefetch depth while it runs, to keep the training
    loop's wait under 2% of its time with as few threads as that takes,
    within ``autotune_max_threads`` (default: one fewer than the cores) and
    ``autotune_memory`` for batch buffers (bytes or "4GiB"; default 1/8 of
    the RAM); ``autotune_log()`` lists its decisions.

    ``decode="gpu"`` (with a CUDA device) also moves JPEG decoding there:
    nvJPEG, loaded at run time, decodes each batch on the GPU's hardware
    JPEG decoder where it has one (A100, H100, H200) and on its GPU decoder
    otherwise; the CPU only reads the bytes. Images nvJPEG does not take
    (CMYK, arithmetic coding, 12-bit) are decoded on the CPU, counted by
    reason in ``stats()``; without nvJPEG the loader says why and decodes
    on the CPU. A staging thread submits batches ahead (copy, the decoder's
    call, the kernel), so the decoder's host work runs beside the training
    loop; ``stage_ahead=False`` submits each batch inside ``next()``
    instead.

    Over a seekable pack (``stoker pack --seekable-jpeg``, index version 7)
    a random crop's JPEG is read in part: its header and only the MCU rows
    the crop covers, checked against the index (``read_crop_rows=False``
    reads every JPEG whole; the pixels are the same either way).

    ``kernel_readahead="auto"`` (the default) switches the kernel's
    read-ahead off on the shard files (local ones, or a remote dataset's
    copies in its cache) for a global shuffle over shards
    larger than the page cache can hold (``MemAvailable``, and the memory
    cgroup's limit less its anonymous memory), where what it reads ahead is
    evicted before use; ``"on"`` and ``"off"`` force it.
    ``stats()["readahead_note"]`` says what was chosen and why (logged at
    creation when read-ahead is switched off).

    ``dataset`` may also be a URL (``http://``, ``https://``, ``s3://``):
    shards are read through a local cache (``cache_dir``, default
    ``$STOKER_CACHE_DIR`` or ``~/.cache/stoker``; ``cache_size`` bytes or a
    string such as ``"20GiB"``) that downloads them ahead in the loader's own
    order with ``connections`` parallel transfers and evicts what is needed
    furthest ahead. ``order="auto"`` (the default) is a global shuffle over
    local data and when the cache holds the whole dataset, and otherwise the
    shard-aware ``"shard_block"`` (shards shuffled, samples shuffled within
    windows of ``shard_window`` shards), which downloads each shard once per
    epoch; ``stats()["order_note"]`` (logged at creation) says what was
    chosen and the bytes an epoch is predicted to download, a warning when a
    global shuffle would download well over the dataset. A cache that cannot
    hold the order's working set is refused, naming the smallest that works.
    """

    def __init__(self, dataset, batch_size=None, shuffle=True, seed=0, rank=None, world_size=None, transform=None,
                 dtype="float32", layout=None, with_indices=False, drop_last=False, num_threads=None, prefetch=None,
                 order="auto", shard_window=None, on_corrupt="error", image_field=None, log_epochs=True,
                 device="cpu", gpu_preprocess=False, cache_dir=None, cache_size="16GiB", connections=8,
                 max_attempts=8, stall_timeout_seconds=30.0, fetch_deadline_seconds=300.0, verify_samples=True,
                 max_image_pixels=None, global_batch_size=None, min_world_size=None, decode="cpu",
                 autotune_max_threads=None, autotune_memory=None, stage_ahead=True, fields=None, map=None,
                 collate=None, batch_transform=None, read_crop_rows=True, kernel_readahead="auto", **unknown):
        _params.refuse_unknown("stoker.Loader", unknown)
        specs, self._transformed = [], None
        if batch_transform is not None and (not callable(batch_transform) or fields is not None):
            raise ValueError("batch_transform (MixUp, CutMix, or any f(images, labels) -> (images, labels)) is for "
                             "the (images, labels) loader: with fields=, call it on the dict's tensors")
        self._batch_transform = batch_transform
        _fields.check_hooks(map, collate)
        if (map is not None or collate is not None) and fields is None:
            raise ValueError("map= and collate= work on typed fields: give fields= too")
        self._map, self._collate = map, collate
        if fields is not None:
            specs, self._transformed, field_transform = _fields.native_specs(fields)
            if transform is not None:
                raise ValueError("with fields=, give the transform to its stoker.Image(transform=...)")
            if gpu_preprocess or decode == "gpu":
                raise ValueError("gpu_preprocess=True and decode=\"gpu\" are for the (images, labels) loader: with "
                                 "fields=, images are decoded and transformed on the CPU (device= still moves the "
                                 "batch's tensors to the GPU)")
            # (Without a transformed image the images buffer stays unused.)
            transform = field_transform or transforms.Compose([transforms.Resize(1), transforms.CenterCrop(1)])
            self._fields = dict(fields)
        if transform is None:
            transform = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                            transforms.Normalize(transforms.IMAGENET_MEAN, transforms.IMAGENET_STD)])
        if not isinstance(transform, transforms.Compose):
            raise TypeError("transform must be a stoker.transforms.Compose (RandomResizedCrop, RandomHorizontalFlip, "
                            "Resize, CenterCrop, Normalize, as in torchvision), not %s.%s: stoker compiles the "
                            "transform into its native pipeline" % (type(transform).__module__,
                                                                    type(transform).__name__))
        name, native_dtype = _params.output_dtype(dtype)
        options = _native.LoaderOptions()
        if global_batch_size is not None:
            # Elastic training: a global batch whatever the world size (see reshard()).
            if batch_size is not None:
                raise ValueError("give batch_size (per rank) or global_batch_size (elastic training), not both")
            options.global_batch_size = _params.integer("global_batch_size", global_batch_size, 1, 1 << 40)
            if min_world_size is None:
                min_world_size = _params.env_int("STOKER_ELASTIC_MIN_WORLD_SIZE", 0) or None
            if min_world_size is not None:
                options.min_world_size = _params.integer("min_world_size", min_world_size, 1, 1 << 20)
        else:
            if min_world_size is not None:
                raise ValueError("min_world_size needs global_batch_size (elastic training)")
            options.batch_size = _params.integer("batch_size", 64 if batch_size is None else batch_size, 1, 1 << 20)
        options.shuffle = _params.boolean("shuffle", shuffle)
        options.order = getattr(_native.Order, _params.choice("order", order,
                                                              ("auto", "shuffle", "shard_block", "sequential")))
        options.shard_window = _params.optional_integer("shard_window", shard_window, 0, 1 << 20)
        options.seed = _params.integer("seed", seed, 0, _params.U64_MAX)
        options.drop_last = _params.boolean("drop_last", drop_last)
        if world_size is None and global_batch_size is not None and not os.environ.get("WORLD_SIZE") and \
                options.min_world_size > 0:
            # Elastic, before the group exists (stoker.elastic.launch --in-process): a placeholder rank,
            # replaced by reshard() once the group forms.
            world_size = options.min_world_size
        options.rank, options.world_size = _params.rank_and_world(rank, world_size)
        autotune = num_threads == "auto" or prefetch == "auto"
        if autotune:
            # The loader tunes its threads and prefetch online (within the budgets); "auto" starts it low.
            options.autotune = True
            options.autotune_max_threads = _params.integer("autotune_max_threads", autotune_max_threads or 0, 0, 1024)
            options.autotune_memory_bytes = parse_size(autotune_memory) if autotune_memory is not None else 0
            num_threads = None if num_threads == "auto" else num_threads
            prefetch = None if prefetch == "auto" else prefetch
        elif autotune_max_threads is not None or autotune_memory is not None:
            raise ValueError("autotune_max_threads and autotune_memory need num_threads=\"auto\" or prefetch=\"auto\"")
        threads = _params.optional_integer("num_threads", num_threads, 0, 1024)
        if threads == 0 and not autotune and str(device) != "cpu" and dict(_native.cuda_status()).get("device_count", 0) > 0:
            # Leave a core to the training thread that launches the GPU's work: on a 16-core H200 machine,
            # 16 decode threads cut ResNet-50's GPU utilisation to 92% where 14 or fewer kept it at 100%.
            threads = max(1, (os.cpu_count() or 2) - 1)
        options.threads = threads
        options.prefetch = _params.optional_integer("prefetch", prefetch, 0, 64)
        options.on_corrupt = getattr(_native.CorruptPolicy, _params.choice("on_corrupt", on_corrupt, ("error", "skip")))
        if image_field is not None and not isinstance(image_field, str):
            raise TypeError("image_field must be a string such as 'jpg', not %r" % (image_field,))
        options.image_field = image_field or ""
        options.fields = specs
        options.verify_samples = _params.boolean("verify_samples", verify_samples)
        options.read_crop_rows = _params.boolean("read_crop_rows", read_crop_rows)
        options.kernel_readahead = getattr(_native.KernelReadahead, _params.choice(
            "kernel_readahead", kernel_readahead, ("auto", "on", "off")))
        t = transform._options()
        t.dtype = native_dtype
        if layout is None:
            layout = "NHWC" if name == "uint8" else "NCHW"
        t.layout = getattr(_native.Layout, _params.choice("layout", layout, ("NCHW", "NHWC")))
        if max_image_pixels is not None:
            t.max_pixels = _params.integer("max_image_pixels", max_image_pixels, 0, _params.U64_MAX)
        options.transform = t
        self._with_indices = _params.boolean("with_indices", with_indices)
        self._log_epochs = log_epochs
        self._location = os.fspath(dataset)
        self._batch_size = options.batch_size if global_batch_size is None else None
        self._drop_last = options.drop_last
        remote = _native.RemoteOptions()
        if cache_dir is not None:
            remote.cache_dir = os.fspath(cache_dir)
        remote.cache_size = parse_size(cache_size)
        if remote.cache_size == 0:
            raise ValueError("cache_size must be above zero")
        remote.connections = _params.integer("connections", connections, 1, 256)
        remote.max_attempts = _params.integer("max_attempts", max_attempts, 1, 1000)
        remote.stall_timeout_seconds = _params.number("stall_timeout_seconds", stall_timeout_seconds, 0, 1e7,
                                                      lo_open=True)
        remote.fetch_deadline_seconds = _params.number("fetch_deadline_seconds", fetch_deadline_seconds, 0, 1e7,
                                                       lo_open=True)
        self._owner = _process.OwnerProcess("stoker.Loader")
        gpu_decode = _params.choice("decode", decode, ("cpu", "gpu")) == "gpu"
        if gpu_decode:
            _find_nvjpeg()
        self._native = _native.Loader(os.fspath(dataset), options, str(device), _params.boolean(
            "gpu_preprocess", gpu_preprocess), gpu_decode, remote, _params.boolean("stage_ahead", stage_ahead))
        if self._native.device_note:
            logging.getLogger("stoker").warning(self._native.device_note)
        self._mover = None
        if fields is not None and self._native.device != "cpu":
            self._mover = _fields.DeviceMover(_torch(), self._native.device)
        native_stats = self._native.stats().as_dict()
        if native_stats["order_note"]:
            # Remote: the order chosen and the download volume it is predicted to cost per epoch.
            logging.getLogger("stoker").log(logging.WARNING if native_stats["order_warning"] else logging.INFO,
                                            native_stats["order_note"])
        if native_stats["corrupt_note"]:
            logging.getLogger("stoker").warning(native_stats["corrupt_note"])
        if kernel_readahead == "auto" and not native_stats["kernel_readahead"]:
            logging.getLogger("stoker").info(native_stats["readahead_note"])
        if gpu_decode:
            decoder = self._native.device_stats().get("decoder", "")
            if self._native.device == "cpu":
                logging.getLogger("stoker").warning("decode='gpu' needs a CUDA device: decoding on the CPU")
            elif decoder.startswith("CPU: "):
                logging.getLogger("stoker").warning("decode='gpu': decoding on the CPU, because %s", decoder[5:])
            else:
                logging.getLogger("stoker").info("decode='gpu': %s", decoder)
        if self._native.loose_files:
            logging.getLogger("stoker").info(
                "%s has no index.stoker: reading it as an ImageFolder of loose files (stoker pack makes it faster)",
                os.fspath(dataset))
        self._last_epoch_summary = None
        self._passes = _passes.Passes()
        self._mark_epoch_start()

    def _end_epoch(self, epoch):
        wall = time.perf_counter() - self._epoch_start_time
        stats = self._native.stats().since(self._epoch_start_stats)
        self._last_epoch_summary = "epoch %d: %s%s" % (epoch, stats.summary(wall),
                                                       _summary.decode_summary(self._native))
        if self._log_epochs:
            logging.getLogger("stoker").info(self._last_epoch_summary)
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

    def autotune_log(self):
        """The autotuner's decisions (num_threads="auto"), each with the batch
        it was taken at and why; empty without autotune."""
        return list(self._native.autotune_log())

    @property
    def decoder(self):
        """Who decodes the JPEGs: "cpu", or with ``decode="gpu"`` the GPU's
        decoder in use ("nvJPEG 12.4, hardware decoder ..."), or "CPU: " and
        why the GPU could not."""
        return self._native.device_stats().get("decoder") or "cpu"

    @property
    def device(self):
        """Where batches arrive: "cpu", or "cuda:N" (a CUDA request falls back
        to "cpu", with a logged warning, where CUDA is unavailable)."""
        return self._native.device

    def _check_process(self):
        self._owner.check()

    def __iter__(self):
        self._check_process()
        from torch.utils.dlpack import from_dlpack
        on_device = self._native.device != "cpu"
        left_at = self._passes.begin(self._native, len(self))  # DataLoader's rule: see _passes
        if left_at is not None and left_at >= len(self):
            self._end_epoch(self._native.epoch - 1)  # the last pass took the whole epoch, not its end
        elif left_at is not None:
            self._mark_epoch_start()
        # Read once, then from each batch: with GPU decode, asking the native
        # loader pauses its staging thread, which no step should wait for.
        epoch = self._native.epoch
        while True:
            # The last batch's buffer goes back to the loader once the caller
            # lets go of it too: this frame must not keep it while asking for
            # the next (the pool has one buffer for the batch in use).
            item = images = labels = indices = batch = samples = None
            if on_device:
                # Batches are copied on stoker's own stream; torch's current
                # stream waits on an event (no host synchronisation).
                torch = _torch()
                stream = torch.cuda.current_stream(torch.device(self._native.device))
                item = self._native.next(stream.cuda_stream)
            else:
                item = self._native.next()
            if item is None:
                self._end_epoch(epoch)
                return
            epoch = item[3]
            if item[5] is not None:
                images = from_dlpack(item[0]) if self._transformed is not None else None
                if self._map is not None or self._collate is not None:
                    # User code per sample, with the GIL: the cost is documented (README).
                    samples = _fields.samples(self._fields, self._transformed, images, item[5])
                    if self._map is not None:
                        samples = [self._map(sample) for sample in samples]
                    batch = (self._collate or _fields.default_collate)(samples)
                    yield batch if self._mover is None else self._mover(batch)
                    continue
                batch = _fields.assemble(self._fields, self._transformed, images, item[5])
                if self._with_indices:
                    batch["__index__"] = from_dlpack(item[2])
                yield batch if self._mover is None else self._mover(batch)
                continue
            images, labels = from_dlpack(item[0]), from_dlpack(item[1])
            if on_device:
                labels = labels.to(images.device, non_blocking=True)
            if self._batch_transform is not None:
                images, labels = self._batch_transform(images, labels)
            if not self._with_indices:
                yield images, labels
                continue
            indices = from_dlpack(item[2])
            if on_device:
                indices = indices.to(images.device, non_blocking=True)
            yield images, labels, indices

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its beginning (its order is a function
        of seed and epoch); right after ``load_state_dict()`` of a position in
        that epoch, keeps the position (the resumed run goes on from there)."""
        self._check_process()
        epoch = _params.integer("epoch", epoch, 0, _params.U64_MAX)
        if self._passes.keeps_restored(epoch, self._native.epoch):
            return  # resumed mid-epoch: see _passes
        if epoch != self._native.epoch:
            self._mark_epoch_start()
        self._native.set_epoch(epoch)
        self._passes.placed()

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

    def reshard(self, rank, world_size):
        """Elastic training: this process becomes rank ``rank`` of
        ``world_size`` from the current position on; threads and buffers stay
        (needs ``global_batch_size``). Follow with ``load_state_dict()`` to
        move to an agreed step."""
        self._check_process()
        self._native.reshard(*_params.rank_in_world(rank, world_size))
        self._passes.placed()

    @property
    def batch_size(self):
        """Samples in each of this rank's batches, as DataLoader's
        ``batch_size`` (the last one short unless ``drop_last``); None with
        ``global_batch_size``, whose ranks' shares differ by up to one."""
        return self._batch_size

    @property
    def drop_last(self):
        return self._drop_last

    @property
    def dataset(self):
        """The dataset as DataLoader code asks about it: ``len(loader.dataset)``
        is its sample count (every rank's), ``classes`` and ``class_to_idx``
        what its labels stand for, as torchvision's ImageFolder has them (the
        class folders' names, kept by ``stoker pack``; None when the labels
        came as numbers); ``location`` is what was given."""
        return DatasetView(self._location, int(self._native.state()["num_samples"]), self._native.class_names)

    @property
    def sampler(self):
        """For loops written for DataLoader with a DistributedSampler:
        ``loader.sampler.set_epoch(epoch)`` is ``loader.set_epoch(epoch)``,
        ``len(loader.sampler)`` the samples this rank's batches hold an epoch."""
        return _passes.EpochSampler(self)

    def _rank_samples_per_epoch(self):
        return self._native.samples_per_epoch

    @property
    def global_batch_size(self):
        """Samples in each global batch (batch_size x world_size, or global_batch_size)."""
        return self._native.state()["global_batch_size"]

    @property
    def batch_capacity(self):
        """The most samples one of this rank's batches can hold."""
        return self._native.batch_capacity

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict()``); the global batch
        (batch_size * world_size), seed and dataset must be the same."""
        self._native.restore(_params.loader_state(dict(state) if hasattr(state, "keys") else state))
        self._passes.placed(restored=True)
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
        "copied_bytes"; with ``decode="gpu"`` also "decoder",
        "decoded_on_device", "decoded_on_hardware", "decode_no_room",
        "decode_batch_failures", "decode_cpu_after_error",
        "decode_corrupt_skipped" (corrupt images found by the GPU decode and
        replaced, with on_corrupt="skip"; included in "corrupt_skipped") and
        "decoded_on_cpu_by_reason" (a dict)."""
        d = self._native.stats().as_dict()
        for k, v in self._native.device_stats().items():
            d["device_" + k if k == "batches" else k] = v
        d["corrupt_skipped"] += d.get("decode_corrupt_skipped", 0)
        return d

    def summary(self):
        """A one-line summary of the last complete epoch (logged at its end
        to the "stoker" logger), or of everything so far before that."""
        if self._last_epoch_summary is not None:
            return self._last_epoch_summary
        wall = time.perf_counter() - self._epoch_start_time
        return self._native.stats().since(self._epoch_start_stats).summary(wall) + _summary.decode_summary(self._native)


class DatasetView:
    """``stoker.Loader.dataset``: what a training loop written for DataLoader
    reads of its dataset (``len()``, ``classes``, ``class_to_idx``), not a
    map-style dataset to index."""

    __slots__ = ("location", "_samples", "classes", "class_to_idx")

    def __init__(self, location, samples, class_names):
        self.location, self._samples = location, samples
        self.classes = list(class_names) if class_names else None
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)} if self.classes else None

    def __len__(self):
        return self._samples

    def __repr__(self):
        return "stoker dataset %r (%s)" % (self.location, counted(self._samples, "sample", "samples"))
