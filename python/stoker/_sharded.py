"""Sharded checkpoints of torch.distributed jobs (docs/checkpoint.md,
"Sharded checkpoints"): every rank saves only the pieces it holds, tensors
replicated on several ranks are written once (their writes spread over the
ranks), rank 0 publishes the step once every rank's files are durable, and
any later job, of any world size and layout, reads back just its slices.

What a rank holds is declared, never guessed: a plain tensor is replicated
(identical on every rank of the group); a ``stoker.Shard`` (and a DTensor or
ShardedTensor, where torch has them) is the block at given offsets of a
larger tensor.
"""
import collections
import functools
import hashlib
import json
import logging
import os
import secrets
import time

from . import _native

log = logging.getLogger("stoker.checkpoint")

_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E4M3FNUZ": 1, "F8_E5M2": 1, "F8_E5M2FNUZ": 1,
                "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8,
                "U64": 8, "F64": 8, "C64": 8}


def _torch():
    import torch
    return torch


def _dims(what, values):
    try:
        dims = tuple(int(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError("%s must be a sequence of ints, not %r" % (what, values)) from None
    if any(d < 0 for d in dims):
        raise ValueError("%s %s has a negative entry" % (what, list(dims)))
    return dims


class Shard:
    """The block of a larger tensor this rank holds: ``tensor`` is the region
    ``[offsets, offsets + tensor.shape)`` of a tensor of ``global_shape``.

    In a state given to ``Checkpointer.save()`` it is saved as that piece of
    the global tensor (several ranks' pieces must tile it; identical pieces
    on several ranks are written once). In a ``target`` given to
    ``load_latest()`` it is filled in place with that block of the saved
    tensor, whatever world size and layout wrote it."""
    __slots__ = ("tensor", "global_shape", "offsets")

    def __init__(self, tensor, global_shape, offsets):
        torch = _torch()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("Shard(tensor=...) must be a torch.Tensor, not %s" % type(tensor).__name__)
        global_shape = _dims("global_shape", global_shape)
        offsets = _dims("offsets", offsets)
        shape = tuple(tensor.shape)
        if not (len(shape) == len(global_shape) == len(offsets)):
            raise ValueError("Shard: the tensor's shape %s, global_shape %s and offsets %s must have the same length"
                             % (list(shape), list(global_shape), list(offsets)))
        for d, (o, n, g) in enumerate(zip(offsets, shape, global_shape)):
            if o + n > g:
                raise ValueError("Shard: the block at offsets %s of shape %s does not fit in global_shape %s "
                                 "(dimension %d)" % (list(offsets), list(shape), list(global_shape), d))
        self.tensor, self.global_shape, self.offsets = tensor, global_shape, offsets

    def __repr__(self):
        return "Shard(%s %s at %s of %s)" % (str(self.tensor.dtype).replace("torch.", ""), list(self.tensor.shape),
                                            list(self.offsets), list(self.global_shape))


# ---- DTensor and ShardedTensor ----------------------------------------------------

def convert_types():
    """The distributed tensor types this torch has (None when it has none)."""
    types = []
    try:
        from torch.distributed.tensor import DTensor
        types.append(DTensor)
    except Exception:
        try:
            from torch.distributed._tensor import DTensor
            types.append(DTensor)
        except Exception:
            pass
    try:
        from torch.distributed._shard.sharded_tensor import ShardedTensor
        types.append(ShardedTensor)
    except Exception:  # ImportError; torch 1.13's module fails to import on Python 3.11 (ValueError)
        pass
    return tuple(types) or None


def convert(obj):
    """A DTensor or ShardedTensor as what this rank holds of it: a Shard, a
    list of Shards, or (a replicated DTensor) a plain tensor."""
    if hasattr(obj, "local_shards"):  # ShardedTensor
        size = list(obj.metadata().size)
        return [Shard(s.tensor, size, s.metadata.shard_offsets) for s in obj.local_shards()]
    placements = obj.placements
    if all(p.is_replicate() for p in placements):
        return obj.to_local()
    if any(p.is_partial() for p in placements):
        raise TypeError("a DTensor with a Partial placement holds partial sums, not values: reduce it "
                        "(.redistribute() or .full_tensor()) before saving")
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError:
        from torch.distributed._tensor._utils import compute_local_shape_and_global_offset
    _, offsets = compute_local_shape_and_global_offset(obj.shape, obj.device_mesh, placements)
    return Shard(obj.to_local(), list(obj.shape), list(offsets))


# ---- who writes what ----------------------------------------------------------------

def plan_writers(layouts):
    """layouts[r]: rank r's [(name, dtype, shape, global_shape, offsets)].
    Every distinct piece (name, offsets) is written by one of the ranks
    holding it, the largest pieces first, each to the holder with the fewest
    bytes so far, so that replicated tensors' writes spread over the ranks.
    The same answer on every rank (deterministic). Returns (per rank, one
    flag per tensor: does this rank write it; bytes per rank)."""
    pieces = {}
    tensors = {}
    for rank, layout in enumerate(layouts):
        for name, dtype, shape, global_shape, offsets in layout:
            shape, global_shape, offsets = tuple(shape), tuple(global_shape), tuple(offsets)
            seen = tensors.setdefault(name, (dtype, global_shape, rank))
            if seen[:2] != (dtype, global_shape):
                raise ValueError("ranks %d and %d disagree on tensor %r: %s %s vs %s %s" % (
                    seen[2], rank, name, seen[0], list(seen[1]), dtype, list(global_shape)))
            key = (name, offsets)
            entry = pieces.get(key)
            if entry is None:
                count = 1
                for n in shape:
                    count *= n
                pieces[key] = [shape, [rank], count * _DTYPE_BYTES[dtype]]
            elif entry[0] != shape:
                raise ValueError("ranks %d and %d hold tensor %r at offsets %s with different shapes %s and %s" % (
                    entry[1][0], rank, name, list(offsets), list(entry[0]), list(shape)))
            else:
                entry[1].append(rank)
    load = [0] * len(layouts)
    writer = {}
    for key in sorted(pieces, key=lambda k: (-pieces[k][2], k)):
        _, holders, size = pieces[key]
        chosen = min(holders, key=lambda h: (load[h], h))
        writer[key] = chosen
        load[chosen] += size
    masks = [[writer[(name, tuple(offsets))] == rank for name, _, _, _, offsets in layout]
             for rank, layout in enumerate(layouts)]
    return masks, load


# ---- the group ----------------------------------------------------------------------

_CONSTRUCTED = collections.Counter()


class Group:
    """A Checkpointer's torch.distributed group: its rank and size, and the
    collectives a sharded save needs (small object gathers)."""

    def __init__(self, group, directory, timeout):
        dist = _torch().distributed
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.directory = directory
        self.timeout = timeout
        self.token = None

    @staticmethod
    def resolve(group):
        """The group a Checkpointer(group=...) means: "default" is the
        initialised default group when it has more than one rank."""
        if group is None:
            return None
        dist = _torch().distributed
        if group == "default":
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return None
            return dist.group.WORLD
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("Checkpointer(group=...): torch.distributed is not initialised")
        return group

    def arrive(self):
        """Every rank has opened its checkpointer (rank 0's removed the
        leftovers of failed saves first), and all know the job's save token.
        First through the store, with a timeout, so that a job constructing
        the Checkpointer on one rank only gets an error instead of a hang;
        then by the group itself (a gather of rank 0's fresh token), which
        orders rank 0's clean-up before any rank's first save even where the
        store outlives a restarted group and still holds an earlier count."""
        dist = _torch().distributed
        store = dist.distributed_c10d._get_default_store()
        # The directory as the program names it (the same on every rank), not its absolute path, which
        # differs between machines that mount the shared folder in different places.
        digest = hashlib.sha1(self.directory.encode()).hexdigest()[:16]
        _CONSTRUCTED[digest] += 1
        key = "stoker/checkpointer/%s/%d/%d/arrived" % (digest, self.world_size, _CONSTRUCTED[digest])
        store.add(key, 1)
        deadline = time.monotonic() + min(self.timeout, 60)
        while True:
            arrived = store.add(key, 0)
            if arrived >= self.world_size:
                break
            if time.monotonic() > deadline:
                from . import StokerError
                raise StokerError(
                    "only %d of the %d ranks constructed stoker.Checkpointer(%r) within %.0f s: in a "
                    "torch.distributed job every rank constructs it and calls save() (each writes its own "
                    "pieces); to save from one process alone (say, rank 0 only), pass group=None" % (
                        arrived, self.world_size, self.directory, min(self.timeout, 60)))
            time.sleep(0.02)
        self.token = self.gather(secrets.token_hex(6) if self.rank == 0 else None)[0]

    def gather(self, obj):
        out = [None] * self.world_size
        _torch().distributed.all_gather_object(out, obj, group=self.group)
        return out


def save(ckpt, step, state, loader, metric, extra, rng):
    """Checkpointer.save() of a distributed job: the ranks agree on the
    step, on skipping (when_busy="skip" and any rank still persisting) and,
    when the layout changed, on who writes which piece; then each saves its
    own pieces under the same save id."""
    from . import _params
    from .checkpoint import _capture_rng, _save_inputs, flatten
    step = _params.integer("step", step, 0)
    loader_state, extra_json = _save_inputs(loader, extra)
    group = ckpt._group
    with ckpt._flat_lock:
        flat = flatten(state, into=ckpt._flat)
        try:
            peers = ckpt._peers
            if ckpt._when_busy == "wait":
                # The previous persist ends first (as save() would wait for it anyway), so that its
                # outcome is known to all ranks before they commit to this one.
                while ckpt._native.busy():
                    time.sleep(0.001)
                if peers is not None:
                    peers.wait()  # it reads the snapshot buffer this save refills
            busy = ckpt._native.busy() or (peers is not None and peers.busy())
            gathered = group.gather((step, flat.layout_digest, busy, ckpt._native.failed()))
            steps = sorted({g[0] for g in gathered})
            if len(steps) > 1:
                raise ValueError("the ranks disagree on the step to save: %s (every rank calls save() for the same "
                                 "step)" % ", ".join("rank %d step %d" % (r, g[0]) for r, g in enumerate(gathered)))
            failed = [r for r, g in enumerate(gathered) if g[3]]
            if failed:
                # A rank whose last persist failed reports it now (raises); the others skip this save
                # rather than write parts that rank 0 would wait for in vain.
                if group.rank in failed:
                    ckpt._native.wait()
                log.warning("rank %d: checkpoint step %d skipped: the previous save failed on rank(s) %s",
                            group.rank, step, ", ".join(map(str, failed)))
                ckpt._skipped_together = getattr(ckpt, "_skipped_together", 0) + 1
                return False
            if ckpt._when_busy == "skip" and any(g[2] for g in gathered):
                ckpt._skipped_together = getattr(ckpt, "_skipped_together", 0) + 1
                return False
            key = tuple(g[1] for g in gathered)
            if key != ckpt._plan_key:
                layouts = group.gather(flat.layout())
                masks, _ = plan_writers(layouts)
                ckpt._writes, ckpt._plan_key = masks[group.rank], key
                ckpt._written = [t for t, w in zip(layouts[group.rank], ckpt._writes) if w]
            ckpt._saves += 1
            save_id = "%s-%d" % (group.token, ckpt._saves)
            for device in flat.devices:
                _torch().cuda.current_stream(device).synchronize()
            metadata = {"stoker.step": str(step), "stoker.rank": str(group.rank)}
            rng_states = _capture_rng() if rng else {}
            started = ckpt._native.save(step, flat, loader_state, rng_states, metadata,
                                        None if metric is None else float(metric), extra_json,
                                        ckpt._writes, save_id)
            if started:
                ckpt._last_save = (step, save_id)
                if peers is not None:
                    peers.start(ckpt._native, step, save_id, ckpt._written, {
                        "loader_state": loader_state, "rng_states": rng_states, "metric": None if metric is None else float(metric),
                        "metadata": metadata, "structure": flat.structure, "extra_json": extra_json})
            return started
        finally:
            flat.release()


def wait_published(directory, step, save_id, rank, timeout):
    """On a rank other than 0: blocks until rank 0 has published the save
    `save_id` (its temporary folder renamed to step-N) or given up on it."""
    temp = os.path.join(directory, ".tmp-sharded-step-%d-%s" % (step, save_id))
    deadline = time.monotonic() + timeout + 30
    delay = 0.002
    failed_note = os.path.join(temp, "rank-00000.failed")
    while os.path.exists(temp):
        if os.path.exists(failed_note):
            from . import StokerError
            try:
                with open(failed_note) as f:
                    why = f.read()
            except OSError:
                why = "(its note vanished)"
            raise StokerError("rank %d: step %d was not published: rank 0 gave up on it: %s; the previous checkpoint "
                              "stays the newest" % (rank, step, why))
        if time.monotonic() > deadline:
            from . import StokerError
            raise StokerError("rank %d: step %d was not published within %.0f s (is rank 0 alive?)"
                              % (rank, step, timeout))
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
    part = os.path.join(directory, "step-%d" % step, "rank-%05d.json" % rank)
    try:
        with open(part, "rb") as f:
            published = (b'"save_id":"%s"' % save_id.encode()) in f.read()
    except OSError:
        published = False
    if not published:
        from . import StokerError
        raise StokerError("rank %d: step %d was not published: rank 0 gave up on it (its save() or wait() says why); "
                          "the previous checkpoint stays the newest" % (rank, step))


# ---- loading ------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _distributed_types():
    return convert_types()


def _named_leaves(node, path, out):
    """Tensors and Shards of a target state by the names save() gives them.
    A DTensor or ShardedTensor (where torch has them) is what this rank
    holds of it: a Shard, or (replicated) its local tensor, filled in place."""
    torch = _torch()
    types = _distributed_types()
    if types is not None and isinstance(node, types):
        node = convert(node)
        if isinstance(node, list):
            if len(node) != 1:
                raise TypeError("target %r is a ShardedTensor with %d local shards on this rank; load_latest fills "
                                "one piece per tensor and rank (give each piece as a stoker.Shard under its own "
                                "name, or one shard per rank)" % (path, len(node)))
            node = node[0]
    if isinstance(node, (Shard, torch.Tensor)):
        out[path or "tensor"] = node
    elif isinstance(node, dict):
        for key, value in node.items():
            _named_leaves(value, "%s.%s" % (path, key) if path else str(key), out)
    elif isinstance(node, (list, tuple)):
        for i, value in enumerate(node):
            _named_leaves(value, "%s.%d" % (path, i) if path else str(i), out)
    return out


def _names_in(node, out):
    if "t" in node:
        out.append(node["t"])
    for value in node.get("d", ()):
        _names_in(value[1], out)
    for value in node.get("l", ()) or node.get("u", ()):
        _names_in(value, out)
    return out


def target_tensors(target, saved, structure, where):
    """What a load fills, for the sharded loader and the restore from
    peers: [(name, tensor, offsets or None for whole)] for the target's
    tensors and Shards, checked against `saved` ({name: (dtype, global
    shape)}), then for each tensor `structure` names beyond them (every
    saved one without a structure) a new whole tensor; and {name: leaf} to
    rebuild the state from. `where` names the checkpoint in errors."""
    from . import CorruptionError
    from .checkpoint import _dtype_tables
    torch = _torch()
    _, from_name = _dtype_tables()
    entries, filled = [], {}

    def add(name, tensor, offsets):
        if name not in saved:
            raise CorruptionError("%s has no tensor %r, which the target asks for" % (where, name))
        dtype, shape = saved[name]
        if from_name.get(dtype) != tensor.dtype:
            raise TypeError("tensor %r is %s in the checkpoint; the target's is %s" % (name, dtype, tensor.dtype))
        if offsets is None and tuple(tensor.shape) != tuple(shape):
            raise ValueError("tensor %r has shape %s in the checkpoint; the target's is %s (a Shard of it?)"
                             % (name, list(shape), list(tensor.shape)))
        entries.append((name, tensor, offsets))

    if target is not None:
        for name, leaf in _named_leaves(target, "", {}).items():
            if isinstance(leaf, Shard):
                if name in saved and tuple(saved[name][1]) != tuple(leaf.global_shape):
                    raise ValueError("tensor %r has global shape %s in the checkpoint; the target's Shard says %s"
                                     % (name, list(saved[name][1]), list(leaf.global_shape)))
                add(name, leaf.tensor, leaf.offsets)
            else:
                add(name, leaf, None)
            filled[name] = leaf
    for name in (_names_in(structure, []) if structure is not None else list(saved)):
        if name in filled or name not in saved:
            continue
        dtype, shape = saved[name]
        if dtype not in from_name:
            raise TypeError("tensor %r has dtype %s, which this torch (%s) cannot represent"
                            % (name, dtype, torch.__version__))
        filled[name] = torch.empty(tuple(shape), dtype=from_name[dtype])
        add(name, filled[name], None)
    return entries, filled


def load(path, target=None, verify=True, rank=None, threads=0, cache_dir=None):
    """(step, state, extras, user document) of the sharded checkpoint at `path`.
    With `target` (this rank's structure of tensors and Shards) its tensors
    are filled in place with their blocks, reading only those bytes; the
    returned state is the saved structure (of this rank, or of the last
    rank when the job was smaller), with the target's tensors in it and any
    tensor the target lacks loaded whole. Without, every tensor is loaded
    whole (one process assembling a checkpoint of many)."""
    from .checkpoint import _unflatten
    torch = _torch()
    remote = None
    if cache_dir is not None:
        remote = _native.RemoteOptions()
        remote.cache_dir = os.fspath(cache_dir)
    checkpoint = _native.ShardedCheckpoint(str(path), verify, remote)
    if rank is None:
        dist = torch.distributed
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    extras = checkpoint.rank_extras(min(rank, checkpoint.world_size - 1))
    user = json.loads(extras["user_json"]) if extras["user_json"] else {}
    saved = {name: (dtype, shape) for name, dtype, shape in checkpoint.tensors()}
    structure = user.get("structure")
    entries, filled = target_tensors(target, saved, structure, "the checkpoint %s" % (path,))
    requests = []
    copies = []  # (target tensor, host buffer) for targets that cannot be filled in place
    for name, tensor, offsets in entries:
        buffer = tensor
        if tensor.device.type != "cpu" or not tensor.is_contiguous():
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype)
            copies.append((tensor, buffer))
        requests.append((name, list(offsets or ()), list(tensor.shape), buffer.data_ptr(),
                         buffer.numel() * buffer.element_size()))
    checkpoint.read_into(requests, threads)
    for tensor, buffer in copies:
        tensor.copy_(buffer)
    if structure is not None:
        state = _unflatten(structure, filled)
    else:
        state = filled
    return checkpoint.step, state, extras, user


def export_safetensors(path, out_dir, prefix="", max_file_size=4 << 30):
    """Writes the sharded checkpoint at `path` as whole tensors in Hugging
    Face's layout: model.safetensors, or model-0000K-of-0000N.safetensors
    files of at most `max_file_size` bytes plus model.safetensors.index.json.
    Only tensors whose names start with `prefix` are exported, without it
    (prefix="model." turns "model.layer.weight" into "layer.weight"). One
    file's tensors are in memory at a time. Returns the files written."""
    checkpoint = _native.ShardedCheckpoint(str(path), True)
    chosen = []
    for name, dtype, shape in checkpoint.tensors():
        if name.startswith(prefix) and len(name) > len(prefix):
            count = 1
            for n in shape:
                count *= n
            chosen.append((name, dtype, tuple(shape), count * _DTYPE_BYTES[dtype]))
    groups, size = [[]], 0
    for item in sorted(chosen, key=lambda t: (-_DTYPE_BYTES[t[1]], t[0])):
        if groups[-1] and size + item[3] > max_file_size:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item[3]
    os.makedirs(out_dir, exist_ok=True)
    names = (["model.safetensors"] if len(groups) == 1 else
             ["model-%05d-of-%05d.safetensors" % (i + 1, len(groups)) for i in range(len(groups))])
    weight_map, total = {}, 0
    for file_name, group in zip(names, groups):
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, dtype, shape, nbytes in group:
            header[name[len(prefix):]] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
            weight_map[name[len(prefix):]] = file_name
            offset += nbytes
        total += offset
        data = bytearray(offset)
        view = memoryview(data)
        address = _torch().frombuffer(data, dtype=_torch().uint8).data_ptr() if offset else 0
        requests, position = [], 0
        for name, dtype, shape, nbytes in group:
            if nbytes:
                requests.append((name, [], list(shape), address + position, nbytes))
            position += nbytes
        checkpoint.read_into(requests)
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        with open(os.path.join(out_dir, file_name), "wb") as f:
            f.write(len(text).to_bytes(8, "little"))
            f.write(text)
            f.write(view)
    if len(groups) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    return [os.path.join(out_dir, n) for n in names]
