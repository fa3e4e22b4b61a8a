"""Persistent checkpoints of a model sharded within replica groups
(run(checkpointer=dict(...)) with a sharded model; see _sharded.py).

**Who writes.** One replica group, the oldest in the job (the lowest
generation its workers first trained in; among equals, the lowest group
id), saves each due step with a stoker.Checkpointer over its own process
group: each of its workers writes its shards (DTensors, so any later layout
reads back just its blocks) and the group's first worker publishes the step.
Every group holds the same shards, so one group's save is the whole state.
The writer changes only when its group is gone (a dead process's directory
locks go with it, and the next writer's first worker removes its leftovers).

**Who reads.** When the generation's live workers hold no step as new as
the newest checkpoint (a job started again, or every replica group failed
at once), the workers holding each shard agree on the newest step, the first
of them that sees it reads its own blocks into its model and optimizer in
place, and hands the state to the others holding that shard. A checkpoint
that cannot be read on any of them is passed over for the next older one,
by every worker alike.
"""
import logging
import time

from . import ElasticError
from ._sharded import _SHARD_TAG, _as_param_like

log = logging.getLogger("stoker.elastic")

_NONE = 1 << 62


def writer_key(first_generation, group_order):
    """The reduction key that picks the writing group: the lowest wins."""
    return (int(first_generation) << 20) | int(group_order)


def checkpoint_state(model, optimizer, extra_state=None):
    """The state a sharded checkpoint holds: the model's and optimizer's
    own state_dict()s, DTensors and all (saved as their blocks)."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    if extra_state is not None:
        state["extra"] = extra_state.state_dict()
    return state


def sharded_steps(directory):
    """{step: path} of the sharded checkpoints published in ``directory``.
    Raises ElasticError when its newest checkpoint is a plain one (written by
    a run of a whole model): a sharded run reads sharded ones only, and
    passing it over would train the job again from its start."""
    from .. import _native
    try:
        folders = _native.step_folders(str(directory).rstrip("/") or "/")
    except OSError:
        return {}
    readable = [f for f in folders if f[2] != "unreadable"]
    if readable and readable[0][2] == "plain":
        raise ElasticError("the newest checkpoint in %s (step %d) was written by a run of a whole model (a plain "
                           "checkpoint); a sharded model resumes from sharded ones: give this run a directory of "
                           "its own" % (directory, readable[0][0]))
    return {step: path for step, path, kind in folders if kind == "sharded"}


def load_into(path, model, optimizer, rank):
    """Fills ``model`` (sharded by FSDP2) in place with this worker's blocks of
    the sharded checkpoint at ``path`` and rebuilds its optimizer's state
    around them. Returns (step, the saved state's other entries, the loader's
    state, the runner's saved metadata)."""
    import torch
    from .. import _native, _sharded_load
    from .._sharded import Shard, convert
    from ..checkpoint import _dtype_tables
    _, from_name = _dtype_tables()
    saved = {name: (dtype, tuple(shape)) for name, dtype, shape in _native.ShardedCheckpoint(str(path), True,
                                                                                             None).tensors()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # The optimizer's states shaped like their parameter are read as the parameter's block; the rest (a step
    # count) whole. An optimizer that has not stepped yet has no state to fill: its targets are made here.
    # Grouped by parameter in one pass over the names (states of tens of thousands of tensors).
    by_param = {}
    for name, (dtype, shape) in saved.items():
        parts = name.split(".")
        if len(parts) == 4 and parts[0] == "optimizer" and parts[1] == "state" and parts[2].isdigit():
            by_param.setdefault(int(parts[2]), []).append((parts[3], dtype, shape))
    states = {}
    for index, entries in by_param.items():
        p = params[index] if index < len(params) else None
        block = convert(p.detach()) if p is not None and hasattr(p, "placements") else None
        for key, dtype, shape in entries:
            if isinstance(block, Shard) and shape == tuple(p.shape):
                local = torch.empty(tuple(block.tensor.shape), dtype=from_name[dtype])
                states.setdefault(index, {})[key] = Shard(local, block.global_shape, block.offsets)
    target = {"model": model.state_dict(), "optimizer": {"state": states}}
    step, state, extras, user = _sharded_load.load(path, target=target, verify=True, rank=rank)
    optimizer_state = state.get("optimizer")
    if not isinstance(optimizer_state, dict) or "param_groups" not in optimizer_state:
        raise ElasticError("the checkpoint %s holds no optimizer state" % (path,))
    rebuilt = {}
    for index, entry in optimizer_state.get("state", {}).items():
        if int(index) >= len(params):
            raise ElasticError("the checkpoint %s has optimizer state for parameter %s; the optimizer has %d"
                               % (path, index, len(params)))
        rebuilt[index] = {k: _as_param_like({_SHARD_TAG: v.tensor} if isinstance(v, Shard) else v,
                                            params[int(index)]) for k, v in entry.items()}
    optimizer.load_state_dict({"state": rebuilt, "param_groups": optimizer_state["param_groups"]})
    meta = dict(((user.get("extra") or {}).get("stoker_elastic")) or {})
    meta["step"] = step
    return step, state, extras["loader_state"], meta


class ShardedCheckpoints:
    """The runner's persistent checkpoints for a sharded model: choosing the
    writing group, saving, and restoring at an agreement. Mixed into
    _Runner, whose attributes it uses (checkpoint_args, checkpoint_dir,
    checkpointer, group, model, optimizer, ...)."""

    first_generation = None  # the generation this worker first trained in
    writes_checkpoints = False

    def _choose_checkpoint_writer(self, reduce):
        g = self.group
        if self.first_generation is None:
            self.first_generation = g.generation
        key = writer_key(self.first_generation, g.replica.group_order)
        self.writes_checkpoints = reduce(g, key, "min") == key
        if not self.writes_checkpoints and self.checkpointer is not None:
            # Before the agreement's next reduction, so that the new writer opens the directory after this close.
            self.checkpointer.close()
            self.checkpointer = None

    def _save_sharded_checkpoint(self):
        if self.checkpoint_args is None or not self.writes_checkpoints:
            return
        if self.checkpointer is None:
            import torch.distributed as dist
            from .. import StokerError
            from ..checkpoint import Checkpointer
            try:  # every worker of the writing group at once (a collective over the group)
                self.checkpointer = Checkpointer(**dict(self.checkpoint_args, group=dist.group.WORLD))
            except StokerError as e:
                log.warning("rank %d: no persistent checkpoint this step: %s", self.group.rank, e)
                return
        if not self.checkpointer.due(self.step):
            return
        start = time.monotonic()
        self.checkpointer.save(self.step, checkpoint_state(self.model, self.optimizer, self.extra_state),
                               loader=self.loader, extra={"stoker_elastic": self._meta()})
        self.summary.checkpoint_seconds.append(time.monotonic() - start)

    def _restore_sharded_checkpoint(self, reduce, live_step, jobs_state_lost):
        """Restores the newest readable checkpoint newer than ``live_step``
        (the newest step a live worker holds); returns its step, or None
        when the live state is as new. Every worker takes the same branch."""
        g, r = self.group, self.group.replica
        steps = sharded_steps(self.checkpoint_dir)
        bound, tried = _NONE, []
        while True:
            best = reduce(g, max((s for s in steps if s < bound), default=-1), "max")
            if best <= live_step:
                if tried:
                    raise ElasticError("no checkpoint in %s could be read (steps %s; the workers' logs say why): "
                                       "starting from an older state would train its samples again"
                                       % (self.checkpoint_dir, ", ".join(map(str, tried))))
                return None
            reader = reduce(r, r.rank if best in steps else _NONE, "min")
            if reduce(g, int(reader == _NONE), "max"):
                raise ElasticError("checkpoint step %d in %s: %s; keep the checkpoints on storage every machine of "
                                   "the job sees" % (best, self.checkpoint_dir,
                                                     "no worker holding shard %d sees it" % r.shard
                                                     if reader == _NONE else "the workers of another shard do not "
                                                     "see it"))
            ok = 1
            if r.rank == reader:
                try:
                    step, state, loader_state, meta = load_into(steps[best], self.model, self.optimizer, r.shard)
                    self._apply_progress(state, loader_state, meta)
                except Exception as e:  # noqa: BLE001 - whatever it was, an older checkpoint may do
                    log.error("rank %d: cannot restore checkpoint %s: %s", g.rank, steps[best], e)
                    ok = 0
            if reduce(g, ok, "min"):
                if g.rank == 0:
                    log.warning("%s: restoring step %d from %s%s",
                                "every replica group failed" if jobs_state_lost else "a new start",
                                best, steps[best], "; the steps after it are trained again" if jobs_state_lost
                                else "")
                return best
            tried.append(best)
            bound = best
