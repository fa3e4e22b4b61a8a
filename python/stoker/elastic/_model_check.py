"""What stoker.elastic can train: one module whose every rank holds the
whole model. It wraps that module in DistributedDataParallel over each group
it forms, so a module the program already wrapped or sharded is refused
here, before any step: DDP over an FSDP module would broadcast rank 0's
shard over every other rank's (a model silently wrong), and a DDP the
program made stays on a group that a failure ends."""
import sys

# Classes by name, so that nothing is imported for the check: torch 1.13's
# torch.distributed.fsdp does not even import on Python 3.11.
_SHARDING_CLASSES = ("FullyShardedDataParallel", "FSDPModule")


def refuse_wrapped_or_sharded(model):
    """Raises TypeError, naming what to pass instead, when ``model`` is
    wrapped in DDP, holds an FSDP (1 or 2) module, or has DTensor
    parameters (tensor parallelism, FSDP2)."""
    if model is None or not hasattr(model, "modules"):
        return
    for name, module in model.named_modules():
        where = "the model" if not name else "its submodule '%s'" % name
        for cls in type(module).__mro__:
            if not cls.__module__.startswith(("torch.nn.parallel", "torch.distributed")):
                continue
            if cls.__name__ == "DistributedDataParallel":
                raise TypeError(
                    "stoker.elastic takes the module itself, not DistributedDataParallel(module): %s is wrapped "
                    "in DDP. It wraps the module in DDP over the group it forms, and again over each group it "
                    "re-forms after a failure (trainer.model); a DDP made by the program would stay on a group "
                    "that a failure ends" % where)
            if cls.__name__ in _SHARDING_CLASSES:
                raise TypeError(
                    "stoker.elastic replicates the whole model on every rank (DDP); %s is sharded by FSDP (%s), "
                    "which it does not support: its DDP would overwrite every rank's shard with rank 0's. Pass "
                    "the unsharded module; or shard it with FSDP2's fully_shard over "
                    "stoker.elastic.replica_group_mesh() and train it with stoker.elastic.run() or Trainer under "
                    "stoker.elastic.launch --in-process --replica-group-size N; or use torch's own FSDP with "
                    "restart-based elasticity (torchrun with stoker.Checkpointer's sharded checkpoints)"
                    % (where, cls.__name__))
    dtensor = _dtensor_types()
    if dtensor:
        for name, p in model.named_parameters():
            if isinstance(p, dtensor) or isinstance(getattr(p, "data", None), dtensor):
                raise TypeError(
                    "stoker.elastic replicates the whole model on every rank (DDP); parameter '%s' is a DTensor "
                    "(sharded by FSDP2 or tensor parallelism), which it does not support. Pass a module with "
                    "plain parameters" % name)


def _dtensor_types():
    """The DTensor classes of the torch in use, from modules the program
    has already imported (a program that made DTensors imported them)."""
    found = []
    for module_name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(module_name)
        cls = getattr(module, "DTensor", None) if module is not None else None
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)
