"""Checkpoints that do not stall training.

``Checkpointer.save()`` copies the state into reusable host buffers and
returns; a native background thread writes safetensors files, fsyncs them and
publishes the checkpoint atomically (a ``step-N`` folder plus a ``latest``
pointer). Nested state (a model's and an optimizer's ``state_dict()``, plain
Python numbers and strings, lists, tuples) is flattened to stable tensor names
such as ``model.layer1.0.conv1.weight`` and ``optimizer.state.0.exp_avg``, and
rebuilt with the same structure by ``load_latest()``.

    ckpt = stoker.Checkpointer("checkpoints", keep_last=3, every_steps=1000)
    start = 0
    restored = ckpt.load_latest()
    if restored is not None:
        model.load_state_dict(restored.state["model"])
        optimizer.load_state_dict(restored.state["optimizer"])
        loader.load_state_dict(restored.loader_state)
        stoker.restore_rng(restored)
        start = restored.step + 1
    for step in range(start, steps):
        ...
        if ckpt.due(step):
            ckpt.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, loader=loader)
    ckpt.wait()
"""
import base64
import collections
import contextlib
import dataclasses
import functools
import gc
import json
import random
import sys
import threading

from . import _native
from . import _params

__all__ = ["Checkpointer", "Checkpoint", "Shard", "load_checkpoint", "load_latest", "load_safetensors",
           "list_checkpoints", "export_safetensors", "restore_rng", "parse_size"]

from . import _sharded
from ._sharded import Shard


def _torch():
    import torch
    return torch


def parse_size(size):
    """Bytes from an int or a string such as "4GiB", "500MB", "1.5G" (the
    command line's rules: K/KB/M/MB/... are powers of 1000, KiB/MiB/... of 1024)."""
    if isinstance(size, str):
        return _native.parse_byte_size(size)
    return _params.integer("size", size, 0, _params.U64_MAX)


@functools.lru_cache(maxsize=None)
def _dtype_tables():
    torch = _torch()
    table = {
        torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.bfloat16: "BF16",
        torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
        torch.bool: "BOOL", torch.complex64: "C64",
    }
    for attr, name in [("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2"), ("float8_e4m3fnuz", "F8_E4M3FNUZ"),
                       ("float8_e5m2fnuz", "F8_E5M2FNUZ"), ("float8_e8m0fnu", "F8_E8M0"), ("uint16", "U16"),
                       ("uint32", "U32"), ("uint64", "U64")]:
        if hasattr(torch, attr):
            table[getattr(torch, attr)] = name
    return table, {v: k for k, v in table.items()}


# ---- flattening nested state into named tensors, and back -------------------

def flatten(state, into=None):
    """`state` flattened in one native pass: .names (the tensors' names, such
    as "optimizer.state.0.exp_avg"), .structure (the JSON that rebuilds the
    state, docs/checkpoint.md), .devices (CUDA devices holding tensors).
    `into`: a FlatState to refill (its storage is reused). Raises TypeError
    for what cannot be checkpointed (save() raises ValueError for two entries
    whose names collide)."""
    torch = _torch()
    table, _ = _dtype_tables()
    flat = _native.FlatState() if into is None else into
    flat.flatten(state, torch.Tensor, torch.strided, collections.OrderedDict, table, _stoker_cuda_usable(),
                 _sharded.Shard, _convert_types(), _sharded.convert)
    return flat


@functools.lru_cache(maxsize=None)
def _convert_types():
    return _sharded.convert_types()


_CUDA_USABLE = None


def _stoker_cuda_usable():
    global _CUDA_USABLE
    if _CUDA_USABLE is None:
        _CUDA_USABLE = _native.cuda_status()["device_count"] > 0
    return _CUDA_USABLE


def _unflatten(node, tensors):
    if "t" in node:
        if node["t"] not in tensors:
            from . import CorruptionError
            raise CorruptionError("the checkpoint's state structure names tensor %r, which none of its files holds"
                                  % (node["t"],))
        return tensors[node["t"]]
    if "d" in node:
        pairs = [(key, _unflatten(value, tensors)) for key, value in node["d"]]
        return collections.OrderedDict(pairs) if node.get("o") else dict(pairs)
    if "l" in node:
        return [_unflatten(v, tensors) for v in node["l"]]
    if "u" in node:
        return tuple(_unflatten(v, tensors) for v in node["u"])
    if "f" in node:
        return float.fromhex(node["f"])
    return node["v"]


# ---- RNG states ---------------------------------------------------------------

def _capture_rng():
    torch = _torch()
    states = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "python": json.dumps(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = json.dumps([base64.b64encode(s.numpy().tobytes()).decode()
                                     for s in torch.cuda.get_rng_state_all()])
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        states["numpy"] = json.dumps([kind, keys.tolist(), pos, has_gauss, cached])
    return states


def restore_rng(checkpoint):
    """Puts torch's, Python's (and numpy's, CUDA's where saved) RNGs back to
    where they were when `checkpoint` was saved."""
    torch = _torch()
    states = checkpoint.rng_states
    if "torch" in states:
        torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(states["torch"])), dtype=torch.uint8))
    if "python" in states:
        version, internal, gauss = json.loads(states["python"])
        random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
                                      for s in json.loads(states["cuda"])])
    if "numpy" in states:
        import numpy
        kind, keys, pos, has_gauss, cached = json.loads(states["numpy"])
        numpy.random.set_state((kind, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached))


# ---- loading --------------------------------------------------------------------

@dataclasses.dataclass
class Checkpoint:
    """A loaded checkpoint. Tensors are zero-copy views of the files, mapped
    copy-on-write: writing to them never changes the files."""
    step: int
    state: object              # the structure given to save(), rebuilt
    loader_state: dict         # for stoker.Loader.load_state_dict(), or None
    extra: dict                # the `extra` given to save()
    metric: float              # or None
    rng_states: dict
    path: str
    skipped: list              # newer checkpoints skipped as corrupt (skip_corrupt=True)


def _tensors_from(raw):
    """{name: tensor} from the native loader's runs: each run is one uint8
    capsule over consecutive tensors of one dtype, viewed as that dtype and
    split in one call (zero-copy)."""
    torch = _torch()
    from torch.utils.dlpack import from_dlpack
    _, from_name = _dtype_tables()
    tensors = {}
    for dtype_name, capsule, names, shapes, numels in raw["runs"]:
        if dtype_name not in from_name:
            raise TypeError("tensor %r has dtype %s, which this torch (%s) cannot represent"
                            % (names[0], dtype_name, torch.__version__))
        flat = from_dlpack(capsule).view(from_name[dtype_name])
        parts = torch.split(flat, numels) if len(numels) > 1 else (flat,)
        for name, shape, part in zip(names, shapes, parts):
            tensors[name] = part if len(shape) == 1 else part.view(shape)
    return tensors


def _to_checkpoint(raw):
    tensors = _tensors_from(raw)
    user = json.loads(raw["user_json"]) if raw["user_json"] else {}
    if "structure" in user:
        state = _unflatten(user["structure"], tensors)
    else:  # written by another tool through the C++ API: a flat dict
        state = tensors
    metadata = dict(raw["metadata"])
    return Checkpoint(step=raw["step"], state=state, loader_state=raw["loader_state"],
                      extra=user.get("extra", metadata), metric=raw["metric"], rng_states=dict(raw["rng_states"]),
                      path=raw["path"], skipped=list(raw["skipped"]))


@contextlib.contextmanager
def _without_cyclic_gc():
    """Rebuilding a state makes a container per entry (tens of thousands),
    which sets off Python's cyclic collector over and over (it more than
    doubled load times); what is built holds no cycles, so it is paused."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _load_sharded(path, target, verify, rank, cache_dir=None):
    step, state, extras, user = _sharded.load(path, target=target, verify=verify, rank=rank, cache_dir=cache_dir)
    return Checkpoint(step=step, state=state, loader_state=extras["loader_state"],
                      extra=user.get("extra", dict(extras["metadata"])), metric=extras["metric"],
                      rng_states=dict(extras["rng_states"]), path=str(path), skipped=[])


def load_checkpoint(path, verify=True, target=None, rank=None):
    """Loads one ``step-N`` folder (every safetensors rule and checksum
    checked). A sharded one (written by the ranks of a distributed job) is
    assembled: with `target`, its tensors and ``stoker.Shard`` entries are
    filled in place with just their blocks (load_latest explains)."""
    with _without_cyclic_gc():
        if _native.is_sharded_checkpoint(str(path)):
            return _load_sharded(path, target, verify, rank)
        if target is not None:
            raise ValueError("load_checkpoint(target=...) is for sharded checkpoints; %s is a plain one" % (path,))
        return _to_checkpoint(_native.load_checkpoint(str(path), verify))


def load_latest(directory, skip_corrupt=False, verify=True, target=None, rank=None, cache_dir=None):
    """The newest complete checkpoint in `directory`, or None when there is
    none. A corrupt newest one raises stoker.CorruptionError, or with
    skip_corrupt=True is skipped (and named in .skipped) for an older one.

    A sharded checkpoint (saved by every rank of a distributed job) is
    resharded on load: `target` is this rank's state structure, whose plain
    tensors (replicated) and ``stoker.Shard`` entries (the block this rank
    holds now, at any world size or layout) are filled in place, reading
    only those bytes; .state is then the saved structure (of this rank, or
    of the last rank of a smaller job) holding the target's tensors. Without
    `target`, every tensor is assembled whole. `rank`: whose loader state,
    RNG states and structure to return (default: this process's rank).

    `directory` may be a URL (http://, https://, s3://) of a sharded
    checkpoint directory (its `latest` names the step) or of a step-N
    folder: the blocks a rank's slices need are fetched by range through
    the shard cache (in `cache_dir`, by default the loader's)."""
    from . import CorruptionError
    if "://" in str(directory):
        with _without_cyclic_gc():
            return _load_sharded(str(directory), target, verify, rank, cache_dir=cache_dir)
    with _without_cyclic_gc():
        folders = _native.step_folders(str(directory).rstrip("/") or "/")
        if not any(kind == "sharded" for _, _, kind in folders):
            if target is not None and folders:
                raise ValueError("load_latest(target=...) is for sharded checkpoints; %s holds plain ones"
                                 % (directory,))
            try:
                raw = _native.load_latest_checkpoint(str(directory), verify, skip_corrupt)
            except FileNotFoundError:
                return None
            return _to_checkpoint(raw)
        skipped = []
        for _, path, kind in folders:
            try:
                if kind == "sharded":
                    loaded = _load_sharded(path, target, verify, rank)
                else:
                    loaded = _to_checkpoint(_native.load_checkpoint(path, verify))
            except CorruptionError as e:
                if not skip_corrupt:
                    raise CorruptionError("the newest checkpoint in %s cannot be loaded (load with skip_corrupt=True "
                                          "to fall back to an older one): %s" % (directory, e)) from None
                skipped.append("%s: %s" % (path, e))
                continue
            loaded.skipped = skipped
            return loaded
        if skipped:
            raise CorruptionError("no complete checkpoint in %s: every one is corrupt (%s)"
                                  % (directory, "; ".join(skipped)))
        return None


def export_safetensors(path, out_dir, prefix="", max_file_size="4GiB"):
    """Writes the sharded checkpoint folder `path` as whole tensors in
    Hugging Face's layout (model.safetensors, or numbered files plus
    model.safetensors.index.json), for inference tools. `prefix`: export only
    the tensors whose names start with it, without it ("model."). Returns
    the paths written."""
    return _sharded.export_safetensors(str(path), str(out_dir), prefix=prefix,
                                       max_file_size=parse_size(max_file_size))


def load_safetensors(path):
    """A plain .safetensors file from any writer, as {name: tensor} (zero-copy)."""
    with _without_cyclic_gc():
        return _tensors_from(_native.load_safetensors(str(path)))


def list_checkpoints(directory):
    """Published checkpoints, oldest first: dicts of step, path, bytes, metric."""
    return _native.list_checkpoints(str(directory))


# ---- saving -----------------------------------------------------------------------

def _save_inputs(loader, extra):
    """save()'s loader state (from a stoker.Loader or its state_dict()) and
    `extra` as JSON (TypeError when it is not JSON-serialisable)."""
    loader_state = loader.state_dict() if hasattr(loader, "state_dict") else loader
    extra_json = None
    if extra is not None:
        try:
            extra_json = json.dumps(extra, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError("`extra` must be JSON-serialisable: %s" % e) from None
    return loader_state, extra_json


class Checkpointer:
    """Saves checkpoints to `directory` in the background.

    keep_last: keep the newest N checkpoints (None or 0: all); keep_best: also
    keep the best K by the `metric` given to save(), lowest first unless
    metric_mode="max". when_busy: "wait" for the previous persist, or "skip"
    the save (counted in stats()). The interval for due(): every_steps, or
    every_seconds, or mtbf_hours for Young/Daly's optimum from the measured
    checkpoint cost (starting at every_seconds, 30 minutes by default, until a
    checkpoint has been measured). max_file_size splits large states across
    files with a model.safetensors.index.json, as Hugging Face does. Saving a
    step whose step-N folder exists already (say, after resuming from an
    older checkpoint) raises FileExistsError unless replace_existing=True.

    Distributed jobs: `group` ("default": the initialised torch.distributed
    group, when it has more than one rank; None: this process alone; or a
    process group) makes the checkpoint sharded. Every rank of the group
    constructs the Checkpointer on the same directory (a file system all of
    them see) and calls save() together; each snapshots and writes only its
    own pieces in parallel, with no gather. Plain tensors are replicated
    (identical on every rank) and written once, their writes spread over
    the ranks; a ``stoker.Shard`` (or a DTensor or ShardedTensor) is the
    block of a global tensor this rank holds. Rank 0 publishes the step once
    every rank's files are durable (waiting at most `commit_timeout`
    seconds). load_latest(target=...) reads it back under any world size.
    """

    def __init__(self, directory, keep_last=3, keep_best=0, metric_mode="min", when_busy="wait",
                 every_steps=None, every_seconds=None, mtbf_hours=None, max_file_size="4GiB", copy_threads=0,
                 replace_existing=False, group="default", commit_timeout=600):
        _params.choice("metric_mode", metric_mode, ("min", "max"))
        _params.choice("when_busy", when_busy, ("wait", "skip"))
        if mtbf_hours is not None:
            interval, mtbf = "auto", _params.number("mtbf_hours", mtbf_hours, 0, 1e7, lo_open=True) * 3600
        elif every_seconds is not None:
            interval, mtbf = "seconds", 24 * 3600.0
        else:
            interval, mtbf = "steps", 24 * 3600.0
        if every_steps is not None and interval != "steps":
            raise ValueError("give one of every_steps, every_seconds or mtbf_hours")
        self.directory = str(directory)
        self._flat = _native.FlatState()
        self._flat_lock = threading.Lock()
        self._when_busy = when_busy
        self._interval = interval
        group = _sharded.Group.resolve(group)
        commit_timeout = _params.number("commit_timeout", commit_timeout, 0, 1e7, lo_open=True)
        self._group = None if group is None else _sharded.Group(group, self.directory, commit_timeout)
        self._plan_key, self._writes, self._saves, self._last_save = None, None, 0, None
        self._native = _native.Checkpointer(
            self.directory, _params.optional_integer("keep_last", keep_last, 0, 1 << 31),
            _params.integer("keep_best", keep_best, 0, 1 << 31), metric_mode == "max", when_busy,
            parse_size(max_file_size), interval, _params.optional_integer("every_steps", every_steps, 1, 1 << 62,
                                                                          default=1000),
            _params.number("every_seconds", every_seconds if every_seconds is not None else 1800, 0, 1e9,
                           lo_open=True),
            mtbf, _params.integer("copy_threads", copy_threads, 0, 64),
            _params.boolean("replace_existing", replace_existing),
            0 if self._group is None else self._group.rank, 1 if self._group is None else self._group.world_size,
            commit_timeout)
        self._commit_timeout = commit_timeout
        if self._group is not None:
            try:
                self._group.arrive()
            except BaseException:
                self._native.close()  # its rank's lock goes now, not when collected
                self._native = None
                raise

    # Distributed saves agree on time-based intervals this often (a tiny
    # gather), following rank 0's policy.
    AGREE_EVERY_STEPS = 50

    @property
    def rank(self):
        return 0 if self._group is None else self._group.rank

    @property
    def world_size(self):
        return 1 if self._group is None else self._group.world_size

    def due(self, step):
        """Whether the interval says to checkpoint at `step`. Distributed,
        every rank gets the same answer: step intervals are the same
        everywhere; time-based ones follow rank 0, asked every
        AGREE_EVERY_STEPS steps (all ranks call due() for the same steps)."""
        step = _params.integer("step", step, 0)
        if self._group is None or self._interval == "steps":
            return self._native.due(step)
        if step % self.AGREE_EVERY_STEPS:
            return False
        return bool(self._group.gather(self._native.due(step))[0])

    def save(self, step, state, loader=None, metric=None, extra=None, rng=True):
        """Snapshots `state` (nested dicts/lists/tuples of tensors and plain
        values) and returns True; False when when_busy="skip" found a persist
        still running. `loader`: a stoker.Loader (or its state_dict()) to
        resume exactly; `extra`: a JSON-able dict returned as Checkpoint.extra;
        `rng`: also save torch/Python/numpy RNG states. CUDA tensors are
        snapshotted by stoker with asynchronous device-to-host copies into
        its page-locked buffer (after torch's current stream finishes its
        queued work)."""
        if self._group is not None:
            return _sharded.save(self, step, state, loader, metric, extra, rng)
        loader_state, extra_json = _save_inputs(loader, extra)
        metadata = {"stoker.step": str(step)}
        # One FlatState reused from save to save (its storage kept); a save
        # made meanwhile from another thread gets one of its own.
        reuse = self._flat_lock.acquire(blocking=False)
        try:
            flat = flatten(state, into=self._flat if reuse else None)
            try:
                # GPU tensors are copied by stoker with asynchronous copies on
                # its own streams; the kernels that wrote them (queued on
                # torch's current streams) must have finished first.
                for device in flat.devices:
                    _torch().cuda.current_stream(device).synchronize()
                return self._native.save(int(step), flat, loader_state, _capture_rng() if rng else {}, metadata,
                                         None if metric is None else float(metric), extra_json)
            finally:
                flat.release()  # the snapshot is taken: the tensors are the caller's again
        finally:
            if reuse:
                self._flat_lock.release()

    def wait(self):
        """Blocks until the checkpoint being persisted is durable; raises if it
        failed. Distributed: until rank 0 has published it (or given up)."""
        self._native.wait()
        if self._group is not None and self._group.rank != 0 and self._last_save is not None:
            step, save_id = self._last_save
            self._last_save = None
            _sharded.wait_published(self.directory, step, save_id, self._group.rank, self._commit_timeout)

    def load_latest(self, skip_corrupt=False, verify=True):
        """The newest complete checkpoint in this directory, or None."""
        return load_latest(self.directory, skip_corrupt=skip_corrupt, verify=verify)

    def stats(self):
        """Counters and timings: last_stall_s (what training waited),
        last_persist_s, skipped_busy, interval_s, expected_overhead, ...
        Distributed: this rank's (bytes_written: its own files), and rank
        and world_size."""
        stats = self._native.stats()
        if self._group is not None:
            stats["rank"], stats["world_size"] = self._group.rank, self._group.world_size
            stats["skipped_busy"] += getattr(self, "_skipped_together", 0)
        return stats

    def close(self):
        """Waits for the persist in flight and releases the directory."""
        if self._native is not None:
            try:
                self._native.wait()
            finally:
                self._native.close()
                self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
