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
import hashlib
import logging
import os
import secrets
import time


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
