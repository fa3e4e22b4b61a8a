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
import logging
import random
import sys

from . import _native
from . import _params
from . import _state_values

__all__ = ["Checkpointer", "Checkpoint", "Shard", "load_checkpoint", "load_latest", "load_safetensors",
           "list_checkpoints", "export_safetensors", "restore_rng", "parse_size"]

from . import _sharded
from . import _sharded_load
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
                 _sharded.Shard, _convert_types(), _sharded.convert, _state_values.to_saved)
    for name in flat.code_entries:
        if name not in _CODE_SAID:
            _CODE_SAID.add(name)
            logging.getLogger("stoker").warning(
                "checkpoint: %r holds code (a method or function, as torch 1.13's OneCycleLR and CyclicLR keep in "
                "their state_dict), not state: saved as its name only and left out on load, so load_state_dict() "
                "keeps the new object's own", name)
    return flat


_CODE_SAID = set()  # code entries already named in a warning (once each per process)


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
        # An entry holding code ({"c": name}, see flatten) is left out: the object being loaded keeps its own.
        pairs = [(key, _unflatten(value, tensors)) for key, value in node["d"] if "c" not in value]
        return collections.OrderedDict(pairs) if node.get("o") else dict(pairs)
    if "l" in node:
        return [_unflatten(v, tensors) for v in node["l"]]
    if "u" in node:
        return tuple(_unflatten(v, tensors) for v in node["u"])
    if "f" in node:
        return float.fromhex(node["f"])
    if "x" in node:  # a NumPy array, an argparse.Namespace, ... saved in another form (_state_values)
        return _state_values.from_saved(node["x"], node.get("a"), _unflatten(node["n"], tensors))
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
    step, state, extras, user = _sharded_load.load(path, target=target, verify=verify, rank=rank, cache_dir=cache_dir)
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


def load_latest(directory, skip_corrupt=False, verify=True, target=None, rank=None, cache_dir=None,
                from_peers=False, group="default", memory_dir=None):
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
    the shard cache (in `cache_dir`, by default the loader's).

    from_peers=True (every rank of `group` calls it together): restore
    from the in-memory copies that Checkpointer(replicate_to_peer=True)
    kept on the ranks' machines (`memory_dir`: as given to it), when the
    copies of one step cover every piece and that step is not older than
    storage's newest; otherwise (logged why) from storage as above."""
    from . import CorruptionError
    if from_peers:
        resolved = _sharded.Group.resolve(group)
        if resolved is None:
            raise ValueError("load_latest(from_peers=True) is collective: it needs an initialised torch.distributed "
                             "group of more than one rank")
        from . import _peer_restore
        with _without_cyclic_gc():
            restored = _peer_restore.restore(str(directory), target, resolved, memory_dir, rank=rank)
        if restored is not None:
            return restored
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
    return _sharded_load.export_safetensors(str(path), str(out_dir), prefix=prefix,
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


from ._checkpointer import Checkpointer  # noqa: E402  (it uses the functions above)
