"""Token streams for language models: stoker.TokenLoader over Megatron-LM's
indexed datasets (PREFIX.idx + PREFIX.bin), and stoker.write_tokens to make
one.

    loader = stoker.TokenLoader("corpus_text_document", seq_len=2048, global_batch_size=512)
    for batch in loader:     # this rank's share of each global batch
        out = model(batch["input_ids"], position_ids=batch["position_ids"])
        loss = F.cross_entropy(out.flatten(0, 1), batch["labels"].flatten())   # -100 is ignored

The documents, in an order shuffled by (seed, epoch) with stoker's own PRNG,
make one stream of tokens cut into rows of ``seq_len`` (a document that does
not fit is split across rows, the standard pretraining packing); the rows are
shuffled too. Every token of every document is in exactly one row an epoch,
over any world size; ``state_dict()`` / ``load_state_dict()`` resume exactly,
under another world size too (same global batch, seed, seq_len and dataset).
"""
import logging
import os
import time

from . import _native, _params, _passes, _process

__all__ = ["TokenLoader", "write_tokens"]

_TOKEN_TYPES = ("uint8", "int8", "int16", "uint16", "int32", "int64", "float32", "float64")


def _byte_size(name, value):
    n = _native.parse_byte_size(value) if isinstance(value, str) else _params.integer(name, value, 1, _params.U64_MAX)
    if n == 0:
        raise ValueError("%s must be above zero" % name)
    return n


class TokenLoader:
    """An iterable of dict batches over a Megatron indexed dataset.

    ``dataset``: the prefix (``PREFIX.idx`` and ``PREFIX.bin``), or a list
    of them blended by ``weights`` (one per dataset; default: proportional
    to each one's size, so each is read exactly once an epoch). A blend
    epoch is the rows of the datasets read; each row's dataset is chosen by
    error diffusion (the one furthest behind its weight's share, as
    Megatron's blending does), so over any 1,000 consecutive rows each
    dataset's share is within 0.2% of its weight, and a dataset that runs
    out starts its own next epoch, reshuffled. Each batch
    holds int64 tensors of shape (rows, seq_len): ``input_ids``, ``labels``
    (the next token of the stream; ``ignore_index`` past the epoch's last
    token, and at each document's last token with
    ``labels_across_documents=False``: the next document's first token,
    which nothing before it predicts, left out of the loss as Megatron's
    ``eod_mask_loss`` and Hugging Face's ``DataCollatorWithFlattening`` do),
    ``position_ids`` (each token's position in its document, so 0
    at each document start), and ``cu_seqlens`` (int32: the boundaries of
    the rows' document pieces and padding over the flattened rows, as
    flash-attention's varlen kernels take them). ``with_indices=True`` adds
    ``documents``: per row the ``(dataset, document, token_offset, length)``
    pieces it holds, and ``__index__``: each row's place in the epoch's
    order (every rank's rows together; the ids the elastic Trainer reports
    for each global batch). ``batch_size`` is per rank; ``global_batch_size`` is
    every rank's together (elastic training: ``reshard()`` keeps it). rank
    and world_size default to torchrun's ``RANK`` and ``WORLD_SIZE``.
    ``vocab_size``: a token at or above it is a ``CorruptionError`` naming
    the document. The last row of an epoch is padded with ``pad_id``.
    ``device="cuda"`` moves each batch's tensors through pinned memory on a
    stream of stoker's own that torch's current stream waits on.

    A prefix may be an ``http(s)://`` or ``s3://`` URL: ``PREFIX.idx`` is
    fetched whole into the cache folder (``cache_dir``, default
    ``$STOKER_CACHE_DIR`` or ``~/.cache/stoker``) and ``PREFIX.bin`` read
    through it in chunks of ``chunk_size`` fetched by HTTP range, the
    chunks of the next ``read_ahead_batches`` batches downloaded ahead in
    the loader's order (``connections`` at once) and the ones needed
    furthest ahead evicted when ``cache_size`` is reached (each remote
    dataset of a blend holds up to ``cache_size`` of its own).
    ``remote_stats()`` tells how the cache did.

    ``kernel_readahead="auto"`` (the default) switches the kernel's
    read-ahead off on the ``.bin`` files (``madvise(MADV_RANDOM)``: a page
    fault reads its page, not the pages around it) when a shuffled order
    reads rows at random over more than the page cache can hold
    (``MemAvailable``, and the memory cgroup's limit less its anonymous
    memory), where what the kernel reads around a row would be evicted
    before use; ``"on"`` and ``"off"`` force it. ``readahead_note`` says
    what was chosen and why (logged when it is switched off).

    ``stats()`` counts the batches, rows and tokens handed out, the time
    the loop waited for a batch, the packing thread's time and the
    downloads it waited for; each epoch's end logs ``summary()`` at INFO
    on the "stoker" logger (``log_epochs=False``: not logged). A child
    forked from the process that made the loader is told to make its own."""

    def __init__(self, dataset, seq_len, batch_size=None, global_batch_size=None, seed=0, shuffle=True, rank=None,
                 world_size=None, with_indices=False, pad_id=0, ignore_index=-100,
                 labels_across_documents=True, vocab_size=None, prefetch=2,
                 weights=None, device="cpu", cache_dir=None, cache_size="16GiB", connections=8, chunk_size="64MiB",
                 read_ahead_batches=16, kernel_readahead="auto", log_epochs=True, **unknown):
        _params.refuse_unknown("stoker.TokenLoader", unknown, instead={
            "num_workers": "nothing: rows are read and packed on the loader's own native threads",
            "collate_fn": "nothing: a batch is packed rows (input_ids, labels, position_ids, cu_seqlens)",
            "prefetch_factor": "prefetch=N batches"})
        prefixes = [os.fspath(d) for d in dataset] if isinstance(dataset, (list, tuple)) else [os.fspath(dataset)]
        if not prefixes:
            raise ValueError("dataset: give a prefix, or a list of them to blend")
        if weights is None:
            weights = []
        else:
            if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
                raise TypeError("weights must be a list of numbers, one per dataset, not %r" % (weights,))
            if len(weights) != len(prefixes):
                raise ValueError("%d weights for %d datasets: give one weight per dataset" % (len(weights),
                                                                                              len(prefixes)))
            weights = [_params.number("weights[%d]" % i, w, 0.0) for i, w in enumerate(weights)]
            if not any(weights):
                raise ValueError("every weight is zero: at least one dataset must be read")
        options = _native.TokenLoaderOptions()
        options.seq_len = _params.integer("seq_len", seq_len, 1, 1 << 24)
        rank, world = _params.rank_and_world(rank, world_size)
        if global_batch_size is not None:
            if batch_size is not None:
                raise ValueError("give batch_size (per rank) or global_batch_size (every rank's together), not both")
            options.global_batch_size = _params.integer("global_batch_size", global_batch_size, 1, 1 << 24)
        else:
            per_rank = _params.integer("batch_size", 8 if batch_size is None else batch_size, 1, 1 << 24)
            options.global_batch_size = per_rank * world
        options.rank, options.world_size = rank, world
        self._rank, self._world_size, self._global_batch_size = rank, world, options.global_batch_size
        options.seed = _params.integer("seed", seed, 0, _params.U64_MAX)
        options.shuffle = _params.boolean("shuffle", shuffle)
        options.with_documents = _params.boolean("with_indices", with_indices)
        options.pad_id = _params.integer("pad_id", pad_id, -(1 << 63), (1 << 63) - 1)
        options.ignore_index = _params.integer("ignore_index", ignore_index, -(1 << 63), (1 << 63) - 1)
        options.labels_across_documents = _params.boolean("labels_across_documents", labels_across_documents)
        options.vocab_size = 0 if vocab_size is None else _params.integer("vocab_size", vocab_size, 1, 1 << 62)
        options.prefetch = _params.integer("prefetch", prefetch, 1, 64)
        options.read_ahead_batches = _params.integer("read_ahead_batches", read_ahead_batches, 1, 65536)
        options.kernel_readahead = getattr(_native.KernelReadahead, _params.choice(
            "kernel_readahead", kernel_readahead, ("auto", "on", "off")))
        remote = _native.RemoteOptions()
        if cache_dir is not None:
            remote.cache_dir = os.fspath(cache_dir)
        remote.cache_size = _byte_size("cache_size", cache_size)
        remote.connections = _params.integer("connections", connections, 1, 256)
        chunk_bytes = _byte_size("chunk_size", chunk_size)
        if not 64 << 10 <= chunk_bytes <= 4 << 30:
            raise ValueError("chunk_size must be between 64KiB and 4GiB, not %r" % (chunk_size,))
        self._native = _native.TokenLoader(prefixes, weights, options, remote, chunk_bytes)
        self._owner = _process.OwnerProcess("stoker.TokenLoader")
        self._prefetch = options.prefetch
        self._log_epochs = log_epochs
        self._last_epoch_summary = None
        self._passes = _passes.Passes()
        self._mark_epoch_start()
        if kernel_readahead == "auto" and not self._native.kernel_readahead:
            logging.getLogger("stoker").info(self._native.readahead_note)
        self._mover = None
        self.device = "cpu"
        if str(device) != "cpu":
            import torch
            dev = torch.device(device)
            if dev.type != "cuda":
                raise ValueError("device must be \"cpu\" or \"cuda[:N]\", not %r" % (device,))
            if not torch.cuda.is_available():
                logging.getLogger("stoker").warning("device=%r: torch sees no usable CUDA device here; the token "
                                                    "batches stay on the CPU" % (device,))
            else:
                from .fields import DeviceMover
                self._mover = DeviceMover(torch, dev)
                self.device = str(dev)

    def __len__(self):
        """Global batches an epoch (each rank gets its share of each)."""
        return self._native.num_batches

    @property
    def readahead_note(self):
        """What ``kernel_readahead`` decided for the ``.bin`` files, and why."""
        return self._native.readahead_note

    def __iter__(self):
        self._owner.check()
        import torch
        from torch.utils.dlpack import from_dlpack
        # Each iter() a pass over an epoch, as DataLoader's (_passes).
        left_at = self._passes.begin(self._native, len(self))
        if left_at is not None and left_at >= len(self):
            self._end_epoch(self._native.epoch - 1)  # the last pass took the whole epoch, not its end
        elif left_at is not None:
            self._mark_epoch_start()
        epoch = self._native.epoch
        while True:
            item = self._native.next()
            if item is None:
                self._end_epoch(epoch)
                return
            epoch = item["epoch"]
            batch = {name: from_dlpack(item[name]) for name in ("input_ids", "labels", "position_ids", "cu_seqlens")}
            if "documents" in item:
                # Each row's place in the epoch's order (every rank's rows together): ids the elastic
                # Trainer gathers to report each global batch, whatever the world size.
                first = item["first_row"]
                batch["__index__"] = torch.arange(first, first + batch["input_ids"].shape[0], dtype=torch.int64)
            if self._mover is not None:
                batch = self._mover(batch)  # pinned, on stoker's own stream; torch's current stream waits on it
            if "documents" in item:
                batch["documents"] = item["documents"]
            yield batch

    def _mark_epoch_start(self):
        # From creation, a reset, or the previous epoch's end: the loader works ahead meanwhile.
        self._epoch_start_time = time.perf_counter()
        self._epoch_start_stats = self.stats()

    def _end_epoch(self, epoch):
        self._last_epoch_summary = "epoch %d: %s" % (epoch, self._summary_since_epoch_start())
        if self._log_epochs:
            logging.getLogger("stoker").info(self._last_epoch_summary)
        self._mark_epoch_start()

    def _summary_since_epoch_start(self):
        start = self._epoch_start_stats
        now, wall = self.stats(), max(1e-9, time.perf_counter() - self._epoch_start_time)
        d = {k: now[k] - start[k] for k in ("batches", "rows", "tokens", "wait_s", "build_s", "remote_wait_s")}
        line = ("%d batches, %d rows, %d tokens in %.2f s (%.0f tokens/s); consumer waited %.2f s (%.1f%%); "
                "packing thread busy %.0f%%" % (d["batches"], d["rows"], d["tokens"], wall, d["tokens"] / wall,
                                                d["wait_s"], 100 * d["wait_s"] / wall,
                                                min(100.0, 100 * d["build_s"] / wall)))
        if d["remote_wait_s"] > 0:
            line += ", %.2f s of it waiting for downloads" % d["remote_wait_s"]
        return line

    def stats(self):
        """Counters since creation: ``batches``, ``rows``, ``tokens`` (not
        padding) handed out; ``wait_s``, the time the training loop waited
        for a batch not ready yet; ``build_s``, the loader's one packing
        thread's time reading and packing batches (``batches_built`` of
        them; page faults on the ``.bin`` files and downloads included);
        ``remote_wait_s``, its time waiting for remote datasets' downloads;
        ``prefetch``."""
        self._owner.check()
        d = dict(self._native.stats())
        d["remote_wait_s"] = sum(r["wait_seconds"] for r in self._native.remote_stats())
        d["prefetch"] = self._prefetch
        return d

    def summary(self):
        """A one-line summary of the last complete epoch (logged at its end
        to the "stoker" logger unless ``log_epochs=False``), or of everything
        so far before that."""
        if self._last_epoch_summary is not None:
            return self._last_epoch_summary
        return self._summary_since_epoch_start()

    @property
    def rank(self):
        return self._rank

    @property
    def world_size(self):
        return self._world_size

    @property
    def sampler(self):
        """For loops written for DataLoader with a DistributedSampler:
        ``loader.sampler.set_epoch(epoch)`` is ``loader.set_epoch(epoch)``,
        ``len(loader.sampler)`` the rows this rank's batches hold an epoch."""
        return _passes.EpochSampler(self)

    def _rank_samples_per_epoch(self):
        # Each global batch splits [r*n/W, (r+1)*n/W) of its n rows to rank r; the last one is short.
        rows, g, r, w = self._native.num_rows, self._global_batch_size, self._rank, self._world_size
        share = lambda n: (r + 1) * n // w - r * n // w  # noqa: E731
        return rows // g * share(g) + share(rows % g)

    @property
    def global_batch_size(self):
        """Rows in each global batch (every rank's together)."""
        return self._global_batch_size

    @property
    def batch_size(self):
        """Rows in each of this rank's batches (the epoch's last one
        short), as DataLoader's ``batch_size``; None when the global batch
        does not split evenly over the ranks (their shares then differ by
        one)."""
        g, w = self._global_batch_size, self._world_size
        return g // w if g % w == 0 else None

    def remote_stats(self):
        """Per dataset, its remote cache's figures: hits, misses, downloads, bytes_downloaded, evictions, retries,
        wait_seconds (zeros for a local dataset)."""
        return self._native.remote_stats()

    @property
    def epoch(self):
        return self._native.epoch

    @property
    def num_tokens(self):
        return self._native.num_tokens

    @property
    def num_documents(self):
        return self._native.num_documents

    @property
    def num_rows(self):
        """Rows of seq_len tokens an epoch (the last one padded)."""
        return self._native.num_rows

    def set_epoch(self, epoch):
        """Starts epoch ``epoch`` from its beginning (its order is a function
        of seed and epoch); right after ``load_state_dict()`` of a position in
        that epoch, keeps the position (the resumed run goes on from there)."""
        self._owner.check()
        epoch = _params.integer("epoch", epoch, 0, _params.U64_MAX)
        if not self._passes.keeps_restored(epoch, self._native.epoch):
            if epoch != self._native.epoch:
                self._mark_epoch_start()
            self._native.set_epoch(epoch)
            self._passes.placed()

    def state_dict(self):
        """Where the loader is (a small dict of ints): ``epoch`` and
        ``batches_consumed`` with what a restore checks; ``num_samples`` is
        the rows an epoch (what the elastic runner counts as samples)."""
        self._owner.check()
        state = dict(self._native.state())
        state["num_samples"] = self._native.num_rows
        return state

    def load_state_dict(self, state):
        """Resumes at ``state`` (from ``state_dict()``): the next pass goes on from there."""
        self._owner.check()
        self._native.restore(dict(state))
        self._passes.placed(restored=True)
        self._mark_epoch_start()

    def reshard(self, rank, world_size):
        """This process becomes rank ``rank`` of ``world_size`` from the current position on."""
        self._owner.check()
        rank, world_size = _params.rank_in_world(rank, world_size)
        self._native.reshard(rank, world_size)
        self._rank, self._world_size = rank, world_size
        self._passes.placed()


def write_tokens(prefix, documents, token_type="uint16", overwrite=False):
    """Writes ``documents`` (an iterable of 1-D sequences of token ids) as a
    Megatron indexed dataset PREFIX.idx + PREFIX.bin, byte-identical to
    Megatron-core's IndexedDatasetBuilder; the index is written last, so an
    interrupted write leaves nothing that opens. Returns the document count."""
    if token_type not in _TOKEN_TYPES:
        raise ValueError("token_type must be one of %s, not %r" % (", ".join(_TOKEN_TYPES), token_type))
    writer = _native.TokenDatasetWriter(os.fspath(prefix), token_type, _params.boolean("overwrite", overwrite))
    for document in documents:
        writer.add_document(document)
    writer.finish()
    return writer.num_documents
