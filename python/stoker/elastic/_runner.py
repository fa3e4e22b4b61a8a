"""The elastic training loop: one committed optimizer step at a time, the
group re-formed and the state re-agreed whenever membership changes.

A step commits on a rank when both of its reductions (gradients with the
loss, then the sample ids with the membership flags) completed there: the
reduced gradient is the same on every rank that has it, so after a failure
the survivors agree on the highest committed step, and whoever is behind
(or new) receives the state from the lowest rank that has it. Nothing is
rolled back; at most the step that was in flight is computed again, by the
new group, over the same global batch.
"""
import io
import logging
import os
import signal
import socket
import time

from . import ElasticError, PeerFailure
from . import _saved
from ._batches import batch_parts
from ._group import JobFinished
from ._replica_groups import GroupLeft
from ._membership import Membership
from ._model_check import refuse_wrapped_or_sharded
from ._replicated_steps import ReplicatedSteps
from ._sharded import (check_sharded, is_sharded, load_local_state, local_state, replica_group,
                       stop_replica_groups)
from ._sharded_steps import ShardedSteps
from ._sharded_checkpoint import ShardedCheckpoints
from ._stragglers import StragglerWatch
from .policy import BatchPolicy, StragglerPolicy, apply_lr_factor, rank_share

log = logging.getLogger("stoker.elastic")

_GROUP_LEFT_EXIT = 75  # a replica group lost a member: its launcher restarts the group


def _torch():
    import torch
    return torch


class RunSummary:
    """What run() did: steps committed by this process, the group changes it
    went through, steps computed again after a failure, and the world sizes seen."""

    def __init__(self):
        self.steps = 0
        self.reconfigurations = 0
        self.recomputed_steps = 0
        self.world_sizes = []
        self.restored_step = None
        self.recovery_seconds = []
        self.left_behind = False  # the group finished the job without this worker (it hung, or came late)
        self.evicted = None  # why this worker left as a straggler (straggler=StragglerPolicy(...)), or None
        self.checkpoint_seconds = []  # the training thread's time in each persistent checkpoint this process saved

    def __repr__(self):
        return ("RunSummary(steps=%d, reconfigurations=%d, recomputed_steps=%d, world_sizes=%r, restored_step=%r%s)"
                % (self.steps, self.reconfigurations, self.recomputed_steps, self.world_sizes, self.restored_step,
                   ", evicted=%r" % self.evicted if self.evicted else ""))


def detect_mode():
    if os.environ.get("STOKER_ELASTIC_STORE"):
        return "in_process"
    if os.environ.get("TORCHELASTIC_RUN_ID") or (os.environ.get("MASTER_ADDR") and os.environ.get("WORLD_SIZE")):
        return "torchrun"
    return "single"


class _Runner(_saved.Saving, Membership, ReplicatedSteps, ShardedSteps, ShardedCheckpoints):
    def __init__(self, train_step, model, optimizer, loader, epochs, policy, checkpointer, on_commit, extra_state,
                 timeout, snapshot_dir, snapshot_every, snapshot_copies, mode, join_timeout, rendezvous_timeout,
                 allow_sharded=False):
        # run(): a model sharded by FSDP2 over replica_group_mesh() trains sharded within its replica group;
        # anything else sharded or wrapped is refused.
        self.sharded = allow_sharded and is_sharded(model)
        if self.sharded:
            check_sharded(model)
            mode = mode or detect_mode()
            if mode != "in_process":
                raise ElasticError("a sharded model trains under stoker.elastic.launch --in-process "
                                   "--replica-group-size N (this is the %s mode)" % mode)
            if checkpointer is not None and not isinstance(checkpointer, dict):
                raise ElasticError("with a sharded model give checkpointer=dict(directory=..., every_steps=...): "
                                   "the job's oldest replica group opens it over its own process group and saves "
                                   "its shards (a Checkpointer made by the program would be one process's)")
            if checkpointer is not None and replica_group()[2] == 1:
                raise ElasticError("checkpointer= with replica groups of one worker: each worker holds the whole "
                                   "model, so train it unsharded (without fully_shard) and its checkpoints are "
                                   "plain ones; sharded checkpoints need --replica-group-size 2 or more")
        else:
            refuse_wrapped_or_sharded(model)
        self.train_step, self.model, self.optimizer = train_step, model, optimizer
        self.epochs, self.on_commit, self.extra_state = epochs, on_commit, extra_state
        # A Checkpointer (one process), or its arguments: then whichever rank is rank 0 opens it (the
        # directory takes one writer) and a rank that stops being rank 0 closes its own.
        if isinstance(checkpointer, dict):
            if "directory" not in checkpointer:
                raise ElasticError("checkpointer=dict(...) needs directory=, as stoker.Checkpointer does")
            self.checkpoint_args, self.checkpointer = dict(checkpointer), None
            self.checkpoint_dir = str(checkpointer["directory"])
        else:
            if checkpointer is not None and getattr(checkpointer, "world_size", 1) > 1:
                raise ElasticError("the elastic runner saves its checkpoints from rank 0 alone: construct the "
                                   "Checkpointer with group=None (or pass checkpointer=dict(...))")
            self.checkpoint_args, self.checkpointer = None, checkpointer
            self.checkpoint_dir = None if checkpointer is None else str(checkpointer.directory)
        self.timeout = timeout
        self.mode = mode or detect_mode()
        self.summary = RunSummary()
        self.make_loader = loader if callable(loader) and not hasattr(loader, "state_dict") else None
        if self.make_loader is None and policy is not None and policy.largest_batch != policy.base_batch:
            raise ElasticError("a batch-size schedule needs loader= to be a function global_batch_size -> Loader")
        self.loader = loader if self.make_loader is None else None
        if policy is None:
            if self.loader is None:
                raise ElasticError("give policy=BatchPolicy(global_batch) with a loader factory")
            policy = BatchPolicy(self.loader.global_batch_size)
        self.policy = policy
        self.lr_factor = 1.0  # the batch policy's factor now in the optimizer's (and scheduler's) lrs
        self.on_commit_all_ranks = False
        self.snapshot_cost = None  # seconds the training thread waited for the last snapshot
        self.step_seconds = None  # a running mean of a step's wall time
        self.last_snapshot_step = -1
        self.graveyard = []  # (when, process group) of groups left with a collective in flight
        self._resharded_to = None  # (loader, rank, world size) of the last reshard
        self.step = -1  # the last committed step (global count from 0); -1: none
        self.last_commit = None
        self.committed_position = None  # the loader's state just after the last committed step
        self.in_flight = False
        self.group = None
        self.rendezvous = None
        self.device_backend = None  # the in-process mode's device group (see run())
        self.members = []
        self.snapshots = None
        self.snapshot_every = snapshot_every
        self.straggler = None  # a StragglerWatch (run(straggler=...)); Trainer keeps its own
        self._batches, self._batches_of = None, None  # the loader's iterator, and the (loader, epoch) it is of
        self.join_timeout, self.rendezvous_timeout = join_timeout, rendezvous_timeout
        self.snapshot_base = None
        self.snapshot_own = None
        # The torchrun agent that started this worker (its parent), watched at each step: see _next_position.
        self.agent_pid = os.getppid() if self.mode == "torchrun" and os.environ.get("TORCHELASTIC_RUN_ID") else None
        if self.mode == "torchrun":
            # In memory (tmpfs), so that restarted workers resume from the last step, not the last checkpoint.
            # One folder per agent and local rank: several agents may share a machine.
            run_id = os.environ.get("TORCHELASTIC_RUN_ID", "none")
            self.snapshot_base = snapshot_dir or os.path.join("/dev/shm", "stoker-elastic-%s-%d" % (run_id,
                                                                                                  os.getuid()))
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
            if local_rank < snapshot_copies:
                from ..checkpoint import Checkpointer
                self.snapshot_own = os.path.join(self.snapshot_base, "%s-%d-local%d" % (
                    socket.gethostname(), self.agent_pid or os.getppid(), local_rank))
                self.snapshots = Checkpointer(self.snapshot_own, keep_last=2, when_busy="wait", group=None)

    # ---- state ---------------------------------------------------------------------

    def _params(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def _device(self):
        for p in self.model.parameters():
            return p.device
        return _torch().device("cpu")

    def _state(self):
        if self.sharded:
            state = local_state(self.model, self.optimizer)  # this worker's shards, sent to the same shard's holder
        else:
            state = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.extra_state is not None:
            state["extra"] = self.extra_state.state_dict()
        return state

    def _meta(self):
        return {"step": self.step, "lr_factor": self.lr_factor, "global_batch": self.loader.global_batch_size,
                "last_commit": self.last_commit}

    def _apply(self, state, loader_state, meta):
        # The optimizer's and the scheduler's states hold the learning rates as the source had them (its
        # schedule and the batch policy's factor included): nothing is set on top of them.
        if self.sharded:
            load_local_state(self.model, self.optimizer, state)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        self._apply_progress(state, loader_state, meta)

    def _apply_progress(self, state, loader_state, meta):
        """_apply's part beyond the model and optimizer: the extra state, the
        step and last commit, the LR factor and the loader's position."""
        if self.extra_state is not None and "extra" in state:
            self.extra_state.load_state_dict(state["extra"])
        self.step = int(meta["step"])
        self.last_commit = meta.get("last_commit")
        self.lr_factor = float(meta.get("lr_factor", 1.0))  # before the loader: its batch is the source's
        self._ensure_loader(int(loader_state["epoch"]))
        self.loader.load_state_dict(loader_state)
        self.committed_position = dict(loader_state)

    def _serialize(self):
        torch = _torch()
        buf = io.BytesIO()
        # The position just after the last committed step, not the loader's own: a batch taken for the step
        # in flight is taken again by the new group, on every rank alike.
        position = self.committed_position if self.committed_position is not None else self.loader.state_dict()
        torch.save({"state": self._state(), "loader": position, "meta": self._meta()}, buf)
        return buf.getvalue()

    # ---- loader -------------------------------------------------------------------

    def _ensure_loader(self, epoch):
        batch = self.policy.global_batch_at(epoch)
        if self.loader is None or self.loader.global_batch_size != batch:
            if self.make_loader is None:
                raise ElasticError("the loader's global batch is %d but the policy asks for %d at epoch %d"
                                   % (self.loader.global_batch_size, batch, epoch))
            old = None if self.loader is None else self.loader.global_batch_size
            self.loader = self.make_loader(batch)
            factor = self.policy.lr_factor(batch)
            if factor != self.lr_factor:
                # Once, at the epoch boundary, on every rank alike (and never again on a restored state,
                # whose factor came with it).
                apply_lr_factor(self.optimizer, self.lr_factor, factor,
                                "global batch %s -> %d at epoch %d, rule %s" % (old, batch, epoch,
                                                                               self.policy.lr_rule),
                                scheduler=self.extra_state)
                self.lr_factor = factor
        if self.group is not None:
            self._reshard()

    def _reshard(self):
        """Moves the loader to this rank's share in the current group; a
        loader already there is left alone (a reshard re-plans the epoch and
        drops what the loader had read ahead)."""
        from .. import StokerError
        where = (id(self.loader), self.group.rank, self.group.world_size)
        if where == self._resharded_to:
            return
        try:
            self.loader.reshard(self.group.rank, self.group.world_size)
            self._resharded_to = where
        except (StokerError, ValueError) as e:
            raise ElasticError("cannot move the loader to rank %d of %d: %s (make it with "
                               "stoker.Loader(..., global_batch_size=B, min_world_size=<the smallest world>))"
                               % (self.group.rank, self.group.world_size, e)) from None

    # ---- the loop --------------------------------------------------------------------

    def run(self):
        if self.mode == "torchrun":
            signal.signal(signal.SIGTERM, _exit_on_sigterm)  # finish the snapshot being written
        try:
            self._begin()
            while True:
                try:
                    change = self._train_until_change()
                except PeerFailure as e:
                    self._on_failure(e)
                    continue
                if change is None:
                    break
                evicted, why = change
                if evicted is not None and evicted == self.group.rank:
                    self.straggler.leave(why)
                    finished = True
                    return self.summary
                self._reconfigure(why)
            self._done()
            finished = True
        except JobFinished as e:
            self._left_behind(e)
            finished = True
        except ElasticError as e:
            finished = False
            self._stop_replica_groups(e)
            raise
        except GroupLeft as e:
            log.error("rank %s: %s; leaving, so that the launcher starts this replica group again (it joins the "
                      "running job and receives its shards from a live group)",
                      self.group.rank if self.group else "?", e)
            finished = False
            raise SystemExit(_GROUP_LEFT_EXIT) from None
        except BaseException:
            finished = False
            raise
        finally:
            self._close(finished)
        return self.summary

    def _train_until_change(self):
        """Trains until the end (None) or until the group must change:
        (rank evicted as a straggler or None, why). Raises PeerFailure when
        a collective fails."""
        torch = _torch()
        while True:
            position = self._next_position()
            if position is None:
                return None
            change = self._one_step(torch, *position)
            if change is not None:
                return change

    def _next_position(self):
        """(epoch, batch index, samples in the epoch) of the next batch to
        train, moving to the next epoch (and its loader) at an epoch's end;
        None when the run's epochs are done."""
        self._leave_if_agent_gone()
        while True:
            st = self.loader.state_dict()
            epoch, consumed = int(st["epoch"]), int(st["batches_consumed"])
            if consumed >= len(self.loader):
                if epoch + 1 >= self.epochs:
                    return None
                self._ensure_loader(epoch + 1)
                self.loader.set_epoch(epoch + 1)
                continue
            if epoch >= self.epochs:
                return None
            return epoch, consumed, int(st["num_samples"])

    def _leave_if_agent_gone(self):
        """A worker whose torchrun agent was killed (SIGKILL, the OOM killer)
        runs on as an orphan since torch 2.0 starts workers in their own
        session: no agent would restart it after a failure, and the other
        agents would wait for its dead agent at their exit barrier. It leaves,
        so that the others re-form without its node from the last snapshot."""
        if self.agent_pid is None or os.getppid() == self.agent_pid:
            return
        log.error("rank %s: the torchrun agent (pid %d) that started this worker is gone; this worker leaves the "
                  "job, and the others go on without its node from the last snapshot (step %d)",
                  self.group.rank if self.group else "?", self.agent_pid, self.step)
        raise SystemExit(1)

    def _take_batch(self, batch_index, num_samples):
        """This rank's share of global batch ``batch_index``: (samples in the
        global batch, first and end positions of the share, the batch as
        batch_parts gives it, its samples, its sample ids, when it was asked
        for). The step is in flight from here."""
        g = self.group
        B = self.loader.global_batch_size
        batch_samples = min(B, num_samples - batch_index * B)
        first, end = rank_share(batch_samples, g.world_size, g.rank)
        self.in_flight = True
        began = time.monotonic()
        batch, samples, indices = batch_parts(self._next_from_loader(batch_index))
        if samples != end - first:
            raise ElasticError("the loader gave %d samples where the split says %d (rank %d of %d, batch %d)"
                               % (samples, end - first, g.rank, g.world_size, batch_index))
        return batch_samples, first, end, batch, samples, indices, began

    def _next_from_loader(self, consumed):
        """The loader's next batch (batch ``consumed`` of its epoch), from one
        iterator per loader and epoch (run() and Trainer): a new iterator per
        batch would cost the loader its overlap, and a new iterator is a new
        pass, which starts the next epoch after one left unfinished (stoker's
        loaders follow DataLoader's rule). ``_batches = None`` (a rebuilt
        group) makes a new one, which starts where the loader was placed."""
        epoch = self.loader.epoch
        if self._batches is None or self._batches_of != (self.loader, epoch):
            self._batches, self._batches_of = iter(self.loader), (self.loader, epoch)
        try:
            return next(self._batches)
        except StopIteration:  # the loader ended its epoch where its position said it had not
            raise ElasticError("the loader ended epoch %d after %d of %d batches (rank %d of %d)" % (
                epoch, consumed, len(self.loader), self.group.rank, self.group.world_size)) from None

    def _one_step(self, torch, epoch, batch_index, num_samples):
        if self.sharded:
            return self._sharded_step(torch, epoch, batch_index, num_samples)
        return self._replicated_step(torch, epoch, batch_index, num_samples)


def _join_timeout(timeout, join_timeout):
    """How long a forming generation waits for a member of the last one that
    is alive but has not come: by default past the collective timeout, since
    such a member is usually still waiting in a collective that ends by it.
    Closing without it sooner would let a worker that left early (cut off,
    then back) start a group of its own beside the others: two groups
    training on."""
    return timeout + 5.0 if join_timeout is None else join_timeout


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def run(train_step, *, model, optimizer, loader, epochs, policy=None, checkpointer=None, on_commit=None,
        extra_state=None, timeout=30.0, snapshot_dir=None, snapshot_every=None, snapshot_copies=2, mode=None,
        join_timeout=None, rendezvous_timeout=600.0, on_commit_all_ranks=False, straggler=None,
        device_backend=None):
    """Trains ``epochs`` epochs of ``loader`` elastically and returns a RunSummary.

    ``train_step(images, labels)`` returns the mean loss of the samples it is
    given (it may get none: then it is not called); with a loader of typed
    fields (``fields=``) it is ``train_step(batch)``, the dict batch's
    slice (each value sliced; the ids under ``"__index__"``). run() does the backward
    pass (scaled so that gradients are the global batch's mean), reduces the
    gradients across the group, and steps ``optimizer``. ``model`` is the
    module, whole on every rank (one wrapped in DDP or sharded by FSDP or
    DTensors is refused with a TypeError), or sharded with FSDP2's
    ``fully_shard`` over ``stoker.elastic.replica_group_mesh()`` under
    ``stoker.elastic.launch --in-process --replica-group-size N`` (the
    gradient shards are then reduced across the replica groups, and a group
    that loses a worker is started again and rejoins; ``checkpointer`` as a
    dict, opened by the job's oldest group, whose workers save their shards;
    ``straggler`` judges groups: a slow group leaves whole). ``loader`` is a
    stoker.Loader made with ``global_batch_size`` (and ``with_indices=True``
    to report sample ids), or a function global_batch_size -> Loader when
    ``policy`` has a schedule. ``on_commit(info)`` runs on rank 0 (every
    rank with ``on_commit_all_ranks=True``) after each committed step:
    {step, epoch, batch, world_size, rank, loss, samples}; after a failure
    the new rank 0 calls it again for the last committed step with
    info["replayed"] = True (make it idempotent); after a restart of every
    worker (torchrun) from a snapshot older than the last commit, the steps
    after the snapshot are trained and committed again, so on_commit sees
    their step numbers a second time (keep the later). ``checkpointer``: the
    arguments of a stoker.Checkpointer as a dict (``dict(directory="ckpt",
    every_steps=1000)``: whichever process is rank 0 opens it and saves when
    due), or a Checkpointer (one process only: a directory takes one writer);
    every start resumes from the newest of these and the snapshots. ``timeout``: seconds a collective
    may wait before a silent peer counts as failed. ``extra_state``: an
    object with state_dict()/load_state_dict() (an LR scheduler, a step
    counter) whose state is tensors, numbers, strings and containers of
    them; it travels with the model and optimizer. Learning rates travel
    in the optimizer's and scheduler's states and are never set over them;
    a batch schedule's LR factor is applied once, at its epoch, to the
    optimizer's lrs and to a scheduler's ``base_lrs`` (when ``extra_state``
    has them). Parameters that get no gradient on any rank keep ``None``.

    The mode follows the environment: stoker.elastic.launch --in-process
    (survivors re-form the group), torchrun or stoker.elastic.launch
    (processes restart; state comes from in-memory snapshots in /dev/shm,
    by the first ``snapshot_copies`` local ranks, every ``snapshot_every``
    steps, by default as often as keeps their whole cost (the wait and the
    background write) within 0.5% of step time and at least every 30 s
    (measured), or from the checkpointer), or one plain process.

    ``straggler``: a StragglerPolicy, which evicts (or names) a worker that
    stays slower than the others (its own time: from taking its batch to
    the end of its backward pass, before the gradients' reduction).

    ``device_backend`` (in-process mode): the group for the gradients of a
    model on a GPU, made anew each generation: "nccl" (the default for a
    model on a GPU), "gloo", or "none" (the host's gloo group takes them).
    On a failure the NCCL group is aborted, from the heartbeat thread as soon
    as a member is found gone, so that a collective waiting for a dead peer
    ends instead of hanging; the survivors then form the next generation.
    """
    try:
        if straggler is not None and not isinstance(straggler, StragglerPolicy):
            raise TypeError("straggler= takes a stoker.elastic.StragglerPolicy, not %s" % type(straggler).__name__)
        runner = _Runner(train_step, model, optimizer, loader, epochs, policy, checkpointer, on_commit, extra_state,
                         timeout, snapshot_dir, snapshot_every, snapshot_copies, mode,
                         _join_timeout(timeout, join_timeout), rendezvous_timeout, allow_sharded=True)
    except (ElasticError, TypeError, ValueError) as e:
        stop_replica_groups("%s: %s" % (type(e).__name__, e))  # a group started again would meet it again
        raise
    runner.on_commit_all_ranks = on_commit_all_ranks
    runner.device_backend = device_backend
    runner.straggler = None if straggler is None else StragglerWatch(straggler, runner)
    return runner.run()
