"""Sharded models (FSDP2 within a replica group, HSDP across groups) for
stoker.elastic's in-process mode.

A **replica group** is N workers of a launcher started with
``--replica-group-size N``: its model is sharded over them with torch's
``fully_shard`` on the mesh replica_group_mesh() gives, which torch's FSDP2
drives (all-gather before forward, reduce-scatter of the gradients after
backward) over the group's own process group. The runner reduces each
gradient shard across the groups (the replica dimension, re-formed whenever
a group fails or joins) over a group of the workers holding the same shard.
A group that loses a worker has lost a shard: its launcher stops the rest of
it and starts it again, and the new group receives each shard's state from
the worker holding it in a live group.
"""
import datetime
import os

from . import ElasticError
from ._reduce import reduction_dtype

_GROUP_ENV = "STOKER_ELASTIC_REPLICA_GROUP"  # "<group id>:<this worker's index>:<workers in the group>"

_mesh = None  # this process's replica group mesh, once made


def replica_group():
    """(group id, this worker's index in it, the group's size) from the
    launcher (--replica-group-size N), or None."""
    spec = os.environ.get(_GROUP_ENV)
    if not spec:
        return None
    try:
        group_id, index, size = spec.rsplit(":", 2)
        index, size = int(index), int(size)
    except ValueError:
        raise ElasticError("%s=%r is not GROUP:INDEX:SIZE (set by stoker.elastic.launch --replica-group-size N)"
                           % (_GROUP_ENV, spec)) from None
    if not group_id or not 0 <= index < size:
        raise ElasticError("%s=%r: index out of the group (set by stoker.elastic.launch --replica-group-size N)"
                           % (_GROUP_ENV, spec))
    return group_id, index, size


def stop_replica_groups(why):
    """Sets the launcher's ``fatal`` mark, so that no replica group is started
    again, for an error every new group would meet again (the program's
    configuration): a launcher would otherwise restart the group
    --max-restarts times. Best effort; nothing outside the launcher."""
    endpoint = os.environ.get("STOKER_ELASTIC_STORE")
    if not endpoint or not os.environ.get(_GROUP_ENV):
        return
    try:
        from ._group import connect_store
        connect_store(endpoint, 10.0).set("fatal", why)
    except Exception:  # noqa: BLE001 - the store is gone: so are the launchers
        pass


def replica_group_mesh(device_type=None, timeout=60.0):
    """The DeviceMesh of this worker's replica group (N workers of its
    launcher, started with ``stoker.elastic.launch --in-process
    --replica-group-size N``), to shard the model over it before run()::

        mesh = stoker.elastic.replica_group_mesh()
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters())
        stoker.elastic.run(train_step, model=model, optimizer=optimizer, ...)

    It makes the group's process group torch's default one (gloo for
    ``device_type="cpu"``; NCCL and gloo for "cuda", the default where a GPU
    is visible), over the launcher's store, and waits for every worker of
    the group. Made once per process: later calls return the same mesh."""
    global _mesh
    if _mesh is not None:
        return _mesh
    spec = replica_group()
    if spec is None or not os.environ.get("STOKER_ELASTIC_STORE"):
        raise ElasticError("replica_group_mesh() needs the workers of stoker.elastic.launch --in-process "
                           "--replica-group-size N (its workers are the replica group the model is sharded over)")
    import torch
    import torch.distributed as dist
    try:
        from torch.distributed.device_mesh import init_device_mesh
    except Exception:  # noqa: BLE001 - absent before torch 2.2; torch 1.13's fsdp package fails on Python 3.11
        why = "sharded elastic training needs torch >= 2.6 (FSDP2's fully_shard and DeviceMesh); this is torch %s" \
            % torch.__version__
        stop_replica_groups(why)
        raise ElasticError(why) from None
    group_id, index, size = spec
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    from ._group import connect_store
    store = dist.PrefixStore("rg/%s/" % group_id, connect_store(os.environ["STOKER_ELASTIC_STORE"], timeout))
    backend = "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(index % torch.cuda.device_count())
    if dist.is_initialized():
        why = ("replica_group_mesh() makes the replica group's default process group, but the program already "
               "initialised one (torch.distributed.init_process_group)")
        stop_replica_groups(why)
        raise ElasticError(why)
    dist.init_process_group(backend, store=store, rank=index, world_size=size,
                            timeout=datetime.timedelta(seconds=timeout))
    _mesh = init_device_mesh(device_type, (size,))
    return _mesh


def is_sharded(model):
    """Whether ``model`` holds modules sharded by FSDP2's fully_shard."""
    if model is None or not hasattr(model, "modules"):
        return False
    return any(cls.__name__ == "FSDPModule" and cls.__module__.startswith("torch.distributed")
               for module in model.modules() for cls in type(module).__mro__)


def check_sharded(model):
    """Raises ElasticError unless ``model`` is sharded over this process's
    replica group mesh (made by replica_group_mesh())."""
    if _mesh is None:
        raise ElasticError("the model is sharded by fully_shard, but not over stoker.elastic.replica_group_mesh(): "
                           "launch with stoker.elastic.launch --in-process --replica-group-size N and shard the "
                           "model on the mesh replica_group_mesh() returns, so that a failed group can be replaced")
    for name, p in model.named_parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is None:
            raise ElasticError("parameter '%s' is not sharded: with a sharded model, shard every parameter (call "
                               "fully_shard on the root module too)" % name)
        if mesh != _mesh:
            raise ElasticError("parameter '%s' is sharded over another mesh than replica_group_mesh()'s" % name)


# ---- gradients --------------------------------------------------------------------------------


def local(tensor):
    """The local shard of a DTensor (a view sharing its storage); a plain tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def pack_local_gradients(torch, params, group_size, device):
    """This worker's gradient shards in one buffer, [shards..., flags...],
    scaled by the group's size: FSDP2's reduce-scatter averages over the
    group, and the runner's loss scaling already makes the sum over every
    worker the global batch's mean."""
    shards = [local(p) for p in params]
    dtype = reduction_dtype(torch, params)
    parts = [local(p.grad).reshape(-1).to(dtype) if p.grad is not None else
             torch.zeros(s.numel(), dtype=dtype, device=device) for p, s in zip(params, shards)]
    flags = torch.tensor([p.grad is not None for p in params], dtype=dtype).to(device)
    flat = torch.cat(parts + [flags]) if parts else flags
    if group_size != 1 and flat.numel() > len(params):
        flat[:flat.numel() - len(params)] *= group_size
    return flat


def unpack_local_gradients(torch, params, flat):
    """Sets each parameter's gradient shard from the reduced buffer; one no
    worker computed a gradient for keeps None."""
    present = flat[flat.numel() - len(params):].tolist()
    offset = 0
    for p, flag in zip(params, present):
        shard = local(p)
        n = shard.numel()
        if flag <= 0:
            p.grad = None
        else:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            local(p.grad).copy_(flat[offset:offset + n].view_as(shard))
        offset += n


# ---- state --------------------------------------------------------------------------------------


_SHARD_TAG = "__stoker_local_shard__"


def _to_local_tree(value, tag=False):
    if hasattr(value, "to_local") and hasattr(value, "placements"):
        shard = value.to_local().detach().clone()
        return {_SHARD_TAG: shard} if tag else shard
    if isinstance(value, dict):
        return {k: _to_local_tree(v, tag) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_local_tree(v, tag) for v in value)
    return value


def local_state(model, optimizer):
    """The model's and optimizer's state with every DTensor as its local
    shard (plain tensors, which torch.save writes without the mesh)."""
    return {"model": _to_local_tree(model.state_dict()),
            "optimizer": _to_local_tree(optimizer.state_dict(), tag=True)}


def load_local_state(model, optimizer, state):
    """Loads local_state()'s output, taken on the worker holding the same
    shard in another group: each shard is copied into this worker's own
    (same shapes: the groups shard the same model the same way)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state["model"]))
    if missing:
        raise ElasticError("the received model state lacks %s" % ", ".join(missing[:5]))
    import torch
    with torch.no_grad():
        for key, target in own.items():
            source = state["model"][key]
            shard = local(target)
            if tuple(shard.shape) != tuple(source.shape):
                raise ElasticError("shard of '%s' is %s here and %s in the received state: the groups do not "
                                   "shard the model alike" % (key, tuple(shard.shape), tuple(source.shape)))
            shard.copy_(source)
    # The optimizer's DTensor states are rebuilt around the received shards, by the parameter they belong to.
    params = [p for group in optimizer.param_groups for p in group["params"]]
    received = state["optimizer"]
    rebuilt = {}
    for index, entry in received["state"].items():
        param = params[int(index)]
        rebuilt[index] = {k: _as_param_like(v, param) for k, v in entry.items()}
    optimizer.load_state_dict({"state": rebuilt, "param_groups": received["param_groups"]})


def _as_param_like(value, param):
    """A received local shard (tagged where it was a DTensor) as a DTensor
    laid out like ``param``; anything else (a step count) as it came."""
    if not (isinstance(value, dict) and set(value) == {_SHARD_TAG}):
        return value
    shard = value[_SHARD_TAG]
    if tuple(shard.shape) != tuple(local(param).shape):
        raise ElasticError("an optimizer state shard is %s here and %s in the received state: the groups do not "
                           "shard the model alike" % (tuple(local(param).shape), tuple(shard.shape)))
    from torch.distributed.tensor import DTensor
    return DTensor.from_local(shard.to(local(param).device), param.device_mesh, param.placements, run_check=False,
                              shape=param.shape, stride=param.stride())
