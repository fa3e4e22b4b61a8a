"""stoker.elastic.Trainer: elastic training around the program's own loop
and its own DistributedDataParallel model.

    trainer = stoker.elastic.Trainer(model, optimizer, loader, epochs=10, scheduler=scheduler)
    for images, labels, indices in trainer:            # this rank's share of each global batch
        with trainer.step():                           # a peer's failure inside ends the step, not the run
            for x, y, weight in trainer.accumulate(images, labels, parts=2):
                loss = F.cross_entropy(trainer.model(x), y) * weight
                loss.backward()                        # DDP reduces the gradients
            torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
            optimizer.step()                           # the step commits here
            scheduler.step()
            optimizer.zero_grad()

``trainer.model`` is the module wrapped in DistributedDataParallel over the
current group (the module itself alone); it is made anew whenever the group
changes, so use it, not a DDP made once. A step commits in
``optimizer.step()`` (wrapped: a small collective on the sample ids first,
then the optimizer's own step): every rank that commits a step has the same
reduced gradient, so after a failure the survivors agree on the newest
committed step, whoever is behind or new receives the model's, the
optimizer's, the scheduler's and the scaler's states from a peer, and the
batch in flight is taken again by the new group. A GradScaler that skips a
step (inf gradients) still commits the batch, without an optimizer step.
With typed fields (a Loader made with ``fields=``) the trainer yields the
dict batches, and ``trainer.accumulate(batch, parts=2)`` slices a dict whole.
Membership, snapshots, checkpoints and the loader are stoker.elastic.run's
(see its help): the same modes, the same exactly-once loader.

A model sharded with FSDP2's ``fully_shard`` over
``stoker.elastic.replica_group_mesh()`` (under ``stoker.elastic.launch
--in-process --replica-group-size N``) trains in the same loop:
``trainer.model`` is then the sharded module itself, FSDP reduces within the
group, and the trainer sums the gradient shards across the groups when the
last micro-batch of ``trainer.accumulate()`` has run its backward pass
(before clipping), or at ``optimizer.step()`` in a loop without it. Weight
each loss by ``trainer.loss_weight`` (accumulate's weight): a worker whose
share of a batch is empty gets one sample of an earlier batch with weight 0,
as FSDP's collectives need the whole group. A GradScaler's inf check sees
the whole summed gradient, so every worker skips a step alike. See
_trainer_sharded.py.
"""
import contextlib
import logging
import os
import time
import types

from . import ElasticError, PeerFailure
from ._batches import batch_parts, slice_batch
from ._extra_state import ExtraState
from ._group import JobFinished
from ._membership import _test_lost_commit
from ._runner import _Runner, _join_timeout
from ._sharded import stop_replica_groups
from ._stragglers import StragglerWatch
from ._trainer_sharded import ShardedTrainer
from .policy import StragglerPolicy, rank_share

log = logging.getLogger("stoker.elastic")

# What gloo, NCCL and DDP say when a peer is gone (anything else a step raises is the program's own).
_PEER_TROUBLE = ("gloo", "Connection closed", "Connection reset", "Timed out", "timed out", "timeout", "NCCL",
                 "Broken pipe", "ProcessGroup", "pair closure", "reset by peer")


class Trainer(ShardedTrainer):
    """Elastic training of the program's own loop (see the module's help).

    ``model``: the module, whole on every rank (not wrapped in DDP, not
    sharded by FSDP or DTensors: those are refused with a TypeError), or
    sharded by FSDP2 over replica_group_mesh() (the module's help);
    ``optimizer``: its optimizer (one); ``loader``: a stoker.Loader with ``global_batch_size``
    (``with_indices=True`` to report sample ids); ``scheduler``, ``scaler``:
    an LR scheduler and a GradScaler whose states travel with the model.
    ``on_commit(info)`` runs on every rank after each committed step: {step,
    epoch, batch, world_size, rank, samples (the global batch's ids),
    rank_samples (this rank's), stepped (False when a scaler skipped the
    optimizer step)}. ``ddp``: keyword arguments for DistributedDataParallel.
    ``straggler``: a StragglerPolicy, which evicts (or names) a worker that
    is slower than the others step after step (None: a slow worker is only
    waited for, up to ``timeout`` per collective). ``device_backend``: the
    group DDP runs over in the in-process mode (NCCL by default for a model
    on a GPU, aborted on failure: see stoker.elastic.run).
    The rest as stoker.elastic.run."""

    def __init__(self, model, optimizer, loader, *, epochs, scheduler=None, scaler=None, policy=None,
                 checkpointer=None, on_commit=None, ddp=None, timeout=30.0, mode=None, join_timeout=None,
                 rendezvous_timeout=600.0, snapshot_dir=None, snapshot_every=None, snapshot_copies=2,
                 straggler=None, device_backend=None):
        try:
            if straggler is not None and not isinstance(straggler, StragglerPolicy):
                raise TypeError("straggler= takes a stoker.elastic.StragglerPolicy, not %s" % type(straggler).__name__)
            extra = ExtraState(scheduler, scaler) if scheduler is not None or scaler is not None else None
            self._r = _Runner(None, model, optimizer, loader, epochs, policy, checkpointer, on_commit, extra, timeout,
                              snapshot_dir, snapshot_every, snapshot_copies, mode,
                              _join_timeout(timeout, join_timeout), rendezvous_timeout, allow_sharded=True)
        except (ElasticError, TypeError, ValueError) as e:
            stop_replica_groups("%s: %s" % (type(e).__name__, e))  # a group started again would meet it again
            raise
        self._r.on_commit_all_ranks = True
        self._r.device_backend = device_backend
        self.module, self.model, self.optimizer = model, model, optimizer
        self._ddp_kwargs = dict(ddp or {})
        self._failure = None
        self._batch = None  # (epoch, batch index, batch samples, first, end, indices) of the batch in flight
        self._committed = False
        self._join = False
        self._to_save = None  # a committed step's info, saved (snapshot, checkpoint) when its body ends
        self._last_commit_time = None
        self._ids, self._ids_pending = None, None  # the commit's collective, started with the batch
        self._handed_out = 0.0  # when the batch in flight was asked of the loader
        self._straggler = None if straggler is None else StragglerWatch(straggler, self._r)
        self._grad_ready = None  # when the last gradient was computed (the straggler policy's clock)
        self._own_time = None  # this rank's own time for its last committed step (ditto)
        self._evict = None  # (rank, why): the straggler policy's decision, carried out before the next batch
        self._wrap_optimizer_step()
        self._share_scaler_decisions(scaler)
        if straggler is not None and not self._sharded:
            self._clock_gradients()

    @property
    def summary(self):
        """A RunSummary of what this process did so far."""
        return self._r.summary

    @property
    def world_size(self):
        return self._r.group.world_size if self._r.group is not None else 1

    @property
    def rank(self):
        return self._r.group.rank if self._r.group is not None else 0

    @property
    def global_step(self):
        """The last committed step (from 0; -1 before the first)."""
        return self._r.step

    # -- the program's loop -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self):
        """One step of the program's loop: a peer's failure inside (a
        collective that fails in the backward pass or at the commit) ends
        the step quietly; the trainer re-forms the group before the next
        batch and this batch is taken again. Other exceptions pass through."""
        try:
            yield
        except PeerFailure as e:
            self._failure = e
        except RuntimeError as e:
            aborted = self._r.rendezvous.aborted_why if self._r.rendezvous is not None else None
            if not any(s in str(e) for s in _PEER_TROUBLE) and not self._peer_gone() and aborted is None:
                raise
            why = str(e).splitlines()[0][:300]
            if aborted is not None:
                why = "%s (the device group was aborted: %s)" % (why, aborted)
            self._failure = PeerFailure("generation %d: %s" % (self._r.group.generation, why))

    def _peer_gone(self):
        """Whether the group's watch (heartbeats, the launcher's marks) sees a member gone, asked now."""
        probe = getattr(self._r.group, "probe", None)
        try:
            return probe is not None and probe() is not None
        except Exception:  # noqa: BLE001 - the store itself is gone: so is the group
            return True

    def loss_weight(self, samples):
        """The factor for the mean loss of ``samples`` of this rank's share,
        so that DDP's average over ranks is the global batch's mean whatever
        the world size and however the batch splits (1 for even shares in one
        pass). With a sharded model: samples / the global batch (FSDP averages
        within the group and the groups' shards are summed), 0 for the
        stand-in sample of an empty share."""
        batch_samples = self._batch[2] if self._batch else samples
        if self._sharded:  # FSDP averages within the group, the groups' shards are summed: weights sum to 1
            return 0.0 if self._filler_active else samples / batch_samples
        return samples * self.world_size / batch_samples

    def accumulate(self, *tensors, parts=2):
        """Yields (*slices, weight) for ``parts`` micro-batches of this rank's
        share, all but the last under DDP's no_sync() (one all-reduce a
        step); weight is loss_weight of the slice. A dict batch (typed
        fields) may be given whole: each micro-batch is then (dict, weight),
        every value sliced."""
        if len(tensors) == 1 and isinstance(tensors[0], dict):
            batch, n, _ = batch_parts(tensors[0])
            for part, weight in self._parts(n, parts, lambda a, b: (slice_batch(batch, a, b),)):
                yield part + (weight,)
        else:
            n = len(tensors[0])
            for part, weight in self._parts(n, parts, lambda a, b: tuple(t[a:b] for t in tensors)):
                yield part + (weight,)
        if self._sharded:
            self._reduce_across_groups()  # the last backward pass is done: before anything reads the gradients

    def _parts(self, n, parts, take):
        bounds = [n * i // parts for i in range(parts + 1)]
        for i in range(parts):
            a, b = bounds[i], bounds[i + 1]
            if b <= a:
                continue
            last = all(bounds[j + 1] <= bounds[j] for j in range(i + 1, parts))
            if self._sharded:
                sync = self._sharded_sync(last)
            else:
                sync = contextlib.nullcontext() if last or not hasattr(self.model, "no_sync") else \
                    self.model.no_sync()
            with sync:
                yield take(a, b), self.loss_weight(b - a)

    def __iter__(self):
        r = self._r
        finished = False
        try:
            r._begin()
            self._rebuild()
            while True:
                if self._batch is not None and self._failure is None and not self._committed:
                    self._commit_safely(stepped=False)  # the body ended without an optimizer step
                if self._to_save is not None:
                    info, self._to_save = self._to_save, None
                    if self._failure is None:
                        r._save(info)
                if self._failure is not None:
                    failure, self._failure, self._batch = self._failure, None, None
                    if self._ids_pending is not None and not self._ids_pending.done():
                        failure.in_flight = True  # its group must outlive the collective left waiting
                    self._ids_pending = None
                    self._last_commit_time = None  # the recovery is no step
                    self.model = None
                    for p in self.module.parameters():
                        p.grad = None  # the failed attempt's partial gradients: the batch is taken again
                    if r.extra_state is not None:
                        r.extra_state.abandon_step()
                    r._on_failure(failure)
                    self._rebuild()
                    continue
                if self._evict is not None:
                    rank, why = self._evict
                    self._evict, self._batch, self.model = None, None, None
                    if r.group.rank == rank:
                        self._straggler.leave(why)
                        finished = True
                        return
                    r._reconfigure(why)
                    self._rebuild()
                    continue
                if self._join:
                    self._join, self._batch = False, None
                    self.model = None
                    r._reconfigure("a worker asked to join")
                    self._rebuild()
                    continue
                if self._sharded and not self._siblings_ready():
                    continue
                item = self._next_batch()
                if item is None:
                    break
                yield item
            r._done()
            finished = True
        except JobFinished as e:
            r._left_behind(e)
            finished = True
        except ElasticError as e:
            r._stop_replica_groups(e)
            raise
        finally:
            r._close(finished)

    # -- inside ----------------------------------------------------------------------------------------------

    def _next_batch(self):
        r = self._r
        position = r._next_position()
        if position is None:
            return None
        epoch, consumed, num_samples = position
        g = r.group
        batch_samples = min(r.loader.global_batch_size, num_samples - consumed * r.loader.global_batch_size)
        first, end = rank_share(batch_samples, g.world_size, g.rank)
        r.in_flight = True
        asked = time.monotonic()
        item = r._next_from_loader(consumed)
        self._batch = (epoch, consumed, batch_samples, first, end, batch_parts(item)[2])
        self._handed_out = asked
        self._committed = False
        if self._sharded:
            return self._sharded_item(item, end - first)  # the commit's collective starts at the commit
        self._start_ids()
        _test_abort(r)
        return item

    def _rebuild(self):
        """DDP over the current group (its constructor broadcasts rank 0's
        parameters: the same as every rank's after the agreement). The
        loader was moved (resharded, rewound): a new iterator follows."""
        self._r._batches = None
        g = self._r.group
        self._own_time = None
        if self._sharded:  # FSDP2 drives the group's collectives; the trainer sums across the groups
            self.model = self.module
            return
        if g.world_size == 1 and not g.owns_device_pg:  # alone (a one-rank NCCL group only when asked for)
            self.model = self.module
            return
        from torch.nn.parallel import DistributedDataParallel
        try:
            # The gradients over the device group where there is one (NCCL: the in-process mode's own, or the
            # program's under torchrun), the host's gloo group otherwise.
            pg = g.device_pg if g.device_pg is not None else g.pg
            self.model = DistributedDataParallel(self.module, process_group=pg, **self._ddp_kwargs)
        except RuntimeError as e:  # its constructor's collectives met a failed peer: the loop re-forms
            if not any(s in str(e) for s in _PEER_TROUBLE) and not self._peer_gone():
                raise
            self.model = None
            self._failure = PeerFailure("generation %d: making DDP: %s" % (g.generation,
                                                                          str(e).splitlines()[0][:300]))

    def _wrap_optimizer_step(self):
        trainer, original = self, self.optimizer.step

        def step(optimizer, *args, **kwargs):
            if trainer._batch is None or trainer._committed:
                return original(*args, **kwargs)  # outside the trainer's loop, or a second step in one batch
            if trainer._sharded:
                trainer._commit_sharded(stepped=True)
            else:
                trainer._commit_ids()
            result = original(*args, **kwargs)
            trainer._after_commit(stepped=True)
            return result
        # A bound method, as torch's LR schedulers expect to find (they wrap it to count steps); a scheduler
        # made before keeps counting through `original`, and is told so (torch 1.13's mark, and 2.x's, whose
        # absence makes the scheduler warn that optimizer.step() was overridden).
        for mark in ("_with_counter", "_wrapped_by_lr_sched"):
            if hasattr(original, mark):
                setattr(step, mark, getattr(original, mark))
        self.optimizer.step = types.MethodType(step, self.optimizer)

    def _start_ids(self):
        """Starts the commit's collective as the batch is handed out: the
        global batch's sample ids, the members present and the joins
        pending, all known now. It runs while the step computes (before
        DDP's buckets, in the same order on every rank), so the commit only
        waits for a result that is usually there: one small collective a
        step, its latency hidden."""
        import torch
        r, g = self._r, self._r.group
        _, _, batch_samples, first, end, indices = self._batch
        timed = self._straggler.slots(g.world_size) if self._straggler is not None else 0
        # Sharded: this step's own time (the commit's collective starts at the commit), and the rank's group.
        ids = torch.zeros(batch_samples + 2 + timed * (2 if self._sharded else 1), dtype=torch.int64)
        if timed:
            self._straggler.write(ids, batch_samples + 2, g.rank, self._own_time)  # the last step's own time
            if self._sharded:
                ids[batch_samples + 2 + timed + g.rank] = g.replica.group_order + 1
        if indices is not None:
            ids[first:end] = indices.cpu().to(torch.int64) + 1
        if g.rank == 0 and r.rendezvous is not None:
            ids[batch_samples] = r.rendezvous.pending_joins()
        ids[batch_samples + 1] = 1
        self._ids = ids
        try:
            self._ids_pending = g.allreduce_async(ids, "sum", commit=True)
        except PeerFailure as e:
            self._ids_pending, self._failure = None, e

    def _commit_ids(self):
        """Finishes the commit's collective. Raises PeerFailure."""
        r, g = self._r, self._r.group
        batch_samples = self._batch[2]
        if self._failure is not None:
            raise self._failure
        pending, self._ids_pending = self._ids_pending, None
        if pending is not None:
            pending.wait()
        _test_lost_commit(r.step + 1)
        if int(self._ids[batch_samples + 1]) != g.world_size:
            raise PeerFailure("%d ranks took part in step %d, the group has %d" % (
                int(self._ids[batch_samples + 1]), r.step + 1, g.world_size))
        r._refuse_commit_if_away(self._handed_out)

    def _commit_safely(self, stepped):
        try:
            if self._sharded:
                self._commit_sharded(stepped)
            else:
                self._commit_ids()
        except PeerFailure as e:
            self._failure = e
            return
        self._after_commit(stepped)

    def _after_commit(self, stepped):
        r, g = self._r, self._r.group
        epoch, batch_index, batch_samples, first, end, indices = self._batch
        ids = self._ids
        self._committed = True
        r.step += 1
        r.summary.steps += 1
        r.in_flight = False
        r.committed_position = r.loader.state_dict()
        info = {"step": r.step, "epoch": epoch, "batch": batch_index, "world_size": g.world_size, "rank": g.rank,
                "stepped": stepped,
                # tolist(), not int() per element: a Trainer step of 48 samples took 0.8 ms less (2 workers)
                "samples": (ids[:batch_samples] - 1).tolist() if indices is not None else None,
                "rank_samples": indices.tolist() if indices is not None else None}
        r.last_commit = info
        if self._sharded:
            self._after_sharded_commit()
        if self._straggler is not None and g.world_size > 1:
            at, n = batch_samples + 2, g.world_size
            if self._sharded:
                self._evict = self._straggler.judge_groups(ids[at:at + n].tolist(), ids[at + n:at + 2 * n].tolist(),
                                                           g.replica.group_order, "batch to the end of its backward")
            else:
                ready, self._grad_ready = self._grad_ready, None
                self._own_time = ready - self._handed_out if ready is not None and ready >= self._handed_out \
                    else None
                self._evict = self._straggler.judge(ids[at:at + n].tolist(), "batch to last gradient")
        # The step's wall time (commit to commit), which sets how often snapshots may be taken.
        now = time.monotonic()
        if self._last_commit_time is not None:
            elapsed = now - self._last_commit_time
            r.step_seconds = elapsed if r.step_seconds is None else 0.9 * r.step_seconds + 0.1 * elapsed
        self._last_commit_time = now
        if r.on_commit is not None:
            r.on_commit(dict(info))
        self._to_save = info  # saved once the body is done: after the scheduler's step that follows
        if r.rendezvous is not None and int(ids[batch_samples]) > r.rendezvous.joins_seen:
            self._join = True

    # -- the straggler policy ------------------------------------------------------------------------------------

    def _clock_gradients(self):
        """Notes when each parameter's gradient is computed: the last one in a
        backward pass marks the end of this rank's own work. Tensor hooks, in
        the autograd engine: DDP's all-reduce runs apart from them, so the
        time DDP waits for a slow peer is not in it. (Not a DDP comm hook: on
        torch 1.13 a Python one leaves a callback on the gloo collective,
        which crashes the process at exit when a peer died during it.)"""
        trainer = self

        def stamp(grad):
            trainer._grad_ready = time.monotonic()
            return grad
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_hook(stamp)


def _test_abort(r):
    """Fault injection for the GPU check: the armed watch fires as the batch
    of step STOKER_ELASTIC_TEST_ABORT_AT_STEP is handed out, once (the
    device group is aborted as if a member were gone; the step then fails
    and the group re-forms)."""
    spec = os.environ.get("STOKER_ELASTIC_TEST_ABORT_AT_STEP")
    if spec and int(spec) == r.step + 1 and r.rendezvous is not None and r.summary.reconfigurations == 0:
        r.rendezvous.fire_armed("test fault: aborting the device group at step %d" % (r.step + 1))
