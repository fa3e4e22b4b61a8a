"""Restoring a sharded checkpoint from the in-memory copies on peers
(stoker._peer_copy makes them): load_latest(..., from_peers=True).

Every rank of the group lists the complete, verified copies its machine
holds; the newest step whose copies cover every rank that wrote it (and
which is not older than the newest checkpoint in storage) is chosen; a
rank whose machine holds a copy serves itself, the others are spread over
its holders; then every rank sends the blocks the others' targets need and fills its own. All
ranks reach the same decisions from the same gathered facts.
"""
import json
import logging
import mmap
import os

from . import _native
from ._peer_copy import _BLOCK_ALIGN, _entries, _global_rank, _round_up, memory_dir_for, transfer_group
from ._sharded_load import target_tensors

log = logging.getLogger("stoker.checkpoint")


def _torch():
    import torch
    return torch


class _Held:
    """A verified copy on this machine, mapped copy-on-write (a target
    written later never changes it)."""

    def __init__(self, folder, name):
        with open(os.path.join(folder, name + ".json")) as f:
            self.meta = json.load(f)
        path = os.path.join(folder, name + ".bin")
        size = self.meta["bytes"]
        self.map = None
        if size:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    raise ValueError("%s has %d bytes, not the %d its description says"
                                     % (path, os.fstat(f.fileno()).st_size, size))
                self.map = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
        checksum = "%016x" % _native.xxh3(self.map if self.map is not None else b"")
        if checksum != self.meta["xxh3"]:
            self.close()
            raise ValueError("%s fails its checksum (xxh3 %s, not %s)" % (path, checksum, self.meta["xxh3"]))

    def piece(self, entry):
        """The piece `entry` of the description as a tensor of its dtype and shape."""
        torch = _torch()
        from .checkpoint import _dtype_tables
        _, from_name = _dtype_tables()
        _, dtype, shape, _, _, begin, nbytes = entry
        if not nbytes:
            return torch.empty(shape, dtype=from_name[dtype])
        raw = torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=begin)
        return raw.view(from_name[dtype]).view(shape)

    def close(self):
        if self.map is not None:
            self.map.close()
            self.map = None


def _scan(folder):
    """{(step, save id, source): _Held} of this machine's usable copies; a
    damaged one is named in the log and left out."""
    held = {}
    for name, (_, source, step, save_id) in sorted(_entries(folder)):
        key = (step, save_id, source)
        if key in held:
            continue  # the same copy held twice on this machine
        try:
            copy = _Held(folder, name)
        except (OSError, ValueError, KeyError) as e:
            log.warning("in-memory checkpoint copy %s/%s is unusable: %s", folder, name, e)
            continue
        held[key] = copy
    return held


def _newest_durable(directory):
    from .checkpoint import list_checkpoints
    try:
        steps = [c["step"] for c in list_checkpoints(directory)]
    except Exception:
        return None
    return max(steps) if steps else None


def _choose(summaries, durable):
    """The (step, save id, world size) to restore, and for each of its
    sources the ranks holding it (sorted); or (None, why)."""
    saves = {}
    for rank, summary in enumerate(summaries):
        for step, save_id, source, world in summary:
            entry = saves.setdefault((step, save_id), {"world": world, "holders": {}})
            entry["holders"].setdefault(source, []).append(rank)
    complete = [key for key, e in saves.items() if set(e["holders"]) == set(range(e["world"]))]
    if not complete:
        partial = ", ".join("step %d: %d of %d ranks' copies" % (k[0], len(e["holders"]), e["world"])
                            for k, e in sorted(saves.items()))
        return None, "no step's copies are complete in memory (%s)" % (partial or "there are none")
    step, save_id = max(complete)
    if durable is not None and durable > step:
        return None, "storage holds a newer step (%d) than memory (%d)" % (durable, step)
    entry = saves[(step, save_id)]
    return (step, save_id, entry["world"], {s: sorted(h) for s, h in entry["holders"].items()}), None


def _server(holders, rank, source):
    """The rank that sends `source`'s blocks to `rank`: itself where its
    machine holds the copy, else one of the holders, spread by rank."""
    held_by = holders[source]
    return rank if rank in held_by else held_by[rank % len(held_by)]


def _blocks(requests_by_rank, pieces):
    """For every requesting rank, in order: (request index, source, piece
    index, lo, hi) of each intersection of a piece with a request, and
    per request the elements covered (to find gaps)."""
    by_name = {}
    for source, entries in pieces.items():
        for i, entry in enumerate(entries):
            by_name.setdefault(entry[0], []).append((source, i, entry))
    plans = []
    for requests in requests_by_rank:
        plan, covered = [], []
        for r, (name, offsets, shape) in enumerate(requests):
            total = 0
            for source, i, entry in by_name.get(name, ()):
                lo = [max(o, p) for o, p in zip(offsets, entry[4])]
                hi = [min(o + n, p + m) for o, n, p, m in zip(offsets, shape, entry[4], entry[2])]
                if all(a < b for a, b in zip(lo, hi)):  # a 0-d tensor: one element, always
                    plan.append((r, source, i, lo, hi))
                    count = 1
                    for a, b in zip(lo, hi):
                        count *= b - a
                    total += count
            covered.append(total)
        plans.append((plan, covered))
    return plans


def _region(tensor, origin, lo, hi):
    return tensor[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, origin))]


def restore(directory, target, group, memory_dir, rank=None):
    """load_latest(from_peers=True): a Checkpoint restored from the peers'
    memory, or None (logged why) when storage must be read instead. Every
    rank of `group` calls it together."""
    torch = _torch()
    dist = torch.distributed
    from .checkpoint import Checkpoint, _unflatten
    group = transfer_group(group)
    me, world = dist.get_rank(group), dist.get_world_size(group)
    folder = memory_dir_for(directory, memory_dir)
    held = _scan(folder)
    try:
        summaries = [None] * world
        dist.all_gather_object(summaries, [(k[0], k[1], k[2], c.meta["world_size"]) for k, c in held.items()],
                               group=group)
        choice, why = _choose(summaries, _newest_durable(directory))
        if choice is None:
            log.warning("rank %d: restoring %s from storage, not from the in-memory copies: %s", me, directory, why)
            return None
        step, save_id, saved_world, holders = choice
        metas = [None] * world
        dist.all_gather_object(metas, {s: held[(step, save_id, s)].meta for s, h in holders.items() if h[0] == me},
                               group=group)
        meta = {int(s): m for served in metas for s, m in served.items()}
        pieces = {s: m["pieces"] for s, m in meta.items()}
        saved = {}
        for entries in pieces.values():
            for name, dtype, _, global_shape, _, _, _ in entries:
                saved[name] = (dtype, tuple(global_shape))
        extras = meta[min(me if rank is None else rank, saved_world - 1)]["extras"]
        structure = json.loads(extras["structure"]) if extras.get("structure") else None

        # This rank's requests: the target's tensors and Shards, and what the structure names besides, whole.
        entries, filled = target_tensors(target, saved, structure, "step %d in memory" % step)
        fills = [(tensor, list(offsets or [0] * tensor.dim())) for _, tensor, offsets in entries]
        requests = [(name, fill[1], list(tensor.shape)) for (name, tensor, _), fill in zip(entries, fills)]

        everyone = [None] * world
        dist.all_gather_object(everyone, requests, group=group)
        plans = _blocks(everyone, pieces)
        for r, (name, _, shape) in enumerate(requests):
            count = 1
            for n in shape:
                count *= n
            if plans[me][1][r] != count:
                from . import CorruptionError
                raise CorruptionError("rank %d: the copies of step %d in memory cover %d of the %d elements of %r "
                                      "it needs" % (me, step, plans[me][1][r], count, name))
        _transfer(me, world, group, plans, pieces, holders, held, (step, save_id), fills, requests)
    finally:
        for copy in held.values():
            copy.close()
    state = _unflatten(structure, filled) if structure is not None else filled
    user_extra = json.loads(extras["extra_json"]) if extras.get("extra_json") else dict(extras.get("metadata") or {})
    log.info("rank %d: restored step %d from the in-memory copies (%s)", me, step, folder)
    return Checkpoint(step=step, state=state, loader_state=extras.get("loader_state"), extra=user_extra,
                      metric=extras.get("metric"), rng_states=dict(extras.get("rng_states") or {}),
                      path="memory:%s" % folder, skipped=[])


_DIRECT_BYTES = 1 << 20  # a block this large travels on its own, from the copy straight into the target


def _transfer(me, world, group, plans, pieces, holders, held, save, fills, requests):
    """Sends the blocks this rank serves to the ranks needing them and
    fills this rank's targets from its own copies and what it receives.
    Between two ranks, blocks of at least _DIRECT_BYTES go one message each
    (from the mapped copy when the block is a whole piece, into the target
    when its region is contiguous host memory); the smaller ones go packed
    in one buffer. Both sides derive the same messages from the same plan."""
    torch = _torch()
    dist = torch.distributed
    from .checkpoint import _dtype_tables
    _, from_name = _dtype_tables()
    sizes = {}

    def block_bytes(source, i, lo, hi):
        entry = pieces[source][i]
        size = sizes.get(entry[1])
        if size is None:
            size = sizes[entry[1]] = torch.empty(0, dtype=from_name[entry[1]]).element_size()
        for a, b in zip(lo, hi):
            size *= b - a
        return size

    def source_block(source, i, lo, hi):
        entry = pieces[source][i]
        return _region(held[(save[0], save[1], source)].piece(entry), entry[4], lo, hi)

    def as_bytes(tensor):
        return tensor.reshape(-1).view(torch.uint8)

    def split(blocks):
        direct, packed = [], []
        for block in blocks:
            (direct if block_bytes(*block[1:]) >= _DIRECT_BYTES else packed).append(block)
        return direct, packed

    works, inbound, keep = [], [], []
    for q in range(world):
        if q == me:
            continue
        direct, packed = split([b for b in plans[q][0] if _server(holders, q, b[1]) == me])
        for k, (_, s, i, lo, hi) in enumerate(direct):
            block = source_block(s, i, lo, hi)
            if not block.is_contiguous():
                block = block.contiguous()
            keep.append(block)
            works.append(dist.isend(as_bytes(block), _global_rank(group, q), group=group, tag=100 + k))
        if packed:
            buffer = torch.empty(sum(_round_up(block_bytes(*b[1:]), _BLOCK_ALIGN) for b in packed), dtype=torch.uint8)
            position = 0
            for _, s, i, lo, hi in packed:
                n = block_bytes(s, i, lo, hi)
                if n:
                    buffer[position:position + n].copy_(as_bytes(source_block(s, i, lo, hi).contiguous()))
                position += _round_up(n, _BLOCK_ALIGN)
            works.append(dist.isend(buffer, _global_rank(group, q), group=group, tag=11))
        direct, packed = split([b for b in plans[me][0] if _server(holders, me, b[1]) == q])
        for k, (r, s, i, lo, hi) in enumerate(direct):
            tensor, origin = fills[r]
            region = _region(tensor, origin, lo, hi)
            landing = region if region.device.type == "cpu" and region.is_contiguous() else None
            if landing is None:
                landing = torch.empty(region.shape, dtype=region.dtype)
                inbound.append(("beside", [(r, s, i, lo, hi)], landing))
            works.append(dist.irecv(as_bytes(landing), _global_rank(group, q), group=group, tag=100 + k))
        if packed:
            buffer = torch.empty(sum(_round_up(block_bytes(*b[1:]), _BLOCK_ALIGN) for b in packed), dtype=torch.uint8)
            works.append(dist.irecv(buffer, _global_rank(group, q), group=group, tag=11))
            inbound.append(("packed", packed, buffer))
    for r, s, i, lo, hi in plans[me][0]:
        if _server(holders, me, s) == me:
            tensor, origin = fills[r]
            _region(tensor, origin, lo, hi).copy_(source_block(s, i, lo, hi))
    for work in works:
        work.wait()
    for kind, blocks, buffer in inbound:
        if kind == "beside":  # a direct block whose target region is not contiguous host memory
            r, _, _, lo, hi = blocks[0]
            tensor, origin = fills[r]
            _region(tensor, origin, lo, hi).copy_(buffer)
            continue
        position = 0
        for r, s, i, lo, hi in blocks:
            n = block_bytes(s, i, lo, hi)
            tensor, origin = fills[r]
            if n:
                block = buffer[position:position + n].view(from_name[pieces[s][i][1]]).view(
                    [b - a for a, b in zip(lo, hi)])
                _region(tensor, origin, lo, hi).copy_(block)
            position += _round_up(n, _BLOCK_ALIGN)
