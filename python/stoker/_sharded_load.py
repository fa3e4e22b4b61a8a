"""Loading sharded checkpoints (docs/checkpoint.md, "Sharded checkpoints"):
each rank's target filled with just its blocks, whatever world size and
layout wrote them; one process assembling everything; the Hugging Face
export. Saving is stoker._sharded's."""
import functools
import json
import os

from . import _native
from ._sharded import _DTYPE_BYTES, Shard, _torch, convert, convert_types


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
    if "n" in node:  # a value saved in another form (stoker._state_values): a NumPy array's bytes, ...
        _names_in(node["n"], out)
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
