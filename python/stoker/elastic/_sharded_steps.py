"""The runner's step and state agreement for a model sharded within replica
groups (see _sharded.py). Mixed into _Runner, whose attributes it uses.

A step: the group's FSDP2 forward and backward (the gradients reduce-scattered
within the group), then the gradient shards summed across the groups over the
workers holding the same shard, then the sample ids and the loss over every
worker. A worker commits when that last reduction completed. One that
completed its shard's reduction but not the last one keeps the reduced shard
(``pending``): any worker that completed the last reduction had every
worker's input, so every worker had finished its shard's reduction; if
anyone committed, such a worker commits the same step when the survivors
agree on it. So every shard of the newest committed step survives on the
workers of every live group, and a new group receives each shard from the
worker holding it in the lowest live group.
"""
import logging
import time

from . import ElasticError
from ._batches import slice_batch
from ._group import _peek
from ._membership import _test_fault, _test_lost_commit, _test_stall, broadcast_bytes, load_from_peer
from ._sharded import pack_local_gradients, unpack_local_gradients

log = logging.getLogger("stoker.elastic")


class ShardedSteps:
    pending = None  # (step, reduced gradient shards, the loader's position after it) awaiting the commit
    _filler = None  # one sample of an earlier batch, for a worker whose share of a batch is empty
    _marked_committed = False
    _sibling_check = None  # (the siblings' Group, its collective started at the last commit)

    def _sharded_step(self, torch, epoch, batch_index, num_samples):
        g = self.group
        r = g.replica
        batch_samples, first, end, batch, samples, indices, began = self._take_batch(batch_index, num_samples)
        self._wait_for_siblings()
        params = self._params()
        for p in params:
            p.grad = None
        device = self._device()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        step_start = time.monotonic()
        # Every worker of a replica group runs the forward and backward passes, even with no samples (a last batch
        # smaller than the world): FSDP2's all-gathers and reduce-scatters need the whole group. Such a worker
        # runs a sample of an earlier batch with a weight of zero.
        if samples:
            self._filler = _copied(slice_batch(batch, 0, 1))  # the loader reuses its buffers
            parts = [(slice_batch(batch, at, at + n), n) for at, n in _offsets(self.policy.micro_batches(samples))]
        elif self._filler is None:
            raise ElasticError("rank %d has no sample in batch %d and none from an earlier batch to run its model's "
                               "sharded passes on (give the epoch's first batch at least one sample a worker)"
                               % (g.rank, batch_index))
        else:
            parts = [(self._filler, 0)]
        for part, n in parts:
            loss = self.train_step(part) if isinstance(part, dict) else self.train_step(*part)
            (loss * (n / batch_samples)).backward()
            if n:
                loss_sum += loss.detach().double() * n
        own_time = time.monotonic() - began  # to backward's end, before the reductions across groups
        flat = pack_local_gradients(torch, params, r.group_size, device)
        r.allreduce(flat, "sum")
        self.pending = (self.step + 1, flat, self.loader.state_dict())
        # Sample ids (+1), the pending joins, a presence count and the loss sum, in float64 (exact below 2^53);
        # with a straggler policy, each rank's own time (microseconds) and its replica group (+1).
        timed = self.straggler.slots(g.world_size) if self.straggler is not None else 0
        ids = torch.zeros(batch_samples + 3 + 2 * timed, dtype=torch.float64)
        if timed:
            self.straggler.write(ids, batch_samples + 3, g.rank, own_time)
            ids[batch_samples + 3 + timed + g.rank] = r.group_order + 1
        if indices is not None:
            ids[first:end] = indices.cpu().to(torch.float64) + 1
        if g.rank == 0 and self.rendezvous is not None:
            ids[batch_samples] = self.rendezvous.pending_joins()
        ids[batch_samples + 1] = 1
        ids[batch_samples + 2] = float(loss_sum)
        _test_stall(self.step + 1)
        g.allreduce(ids, "sum")
        if int(ids[batch_samples + 1]) != g.world_size:
            raise ElasticError("%d ranks took part in step %d, the group has %d" % (int(ids[batch_samples + 1]),
                                                                                  self.step + 1, g.world_size))
        try:
            self._refuse_commit_if_away(began)
        except BaseException:
            self.pending = None  # what it would commit may mix halves the others abandoned
            raise
        _test_lost_commit(self.step + 1)
        self._commit_pending()
        self._start_sibling_check()
        info = {"step": self.step, "epoch": epoch, "batch": batch_index, "world_size": g.world_size,
                "rank": g.rank, "loss": float(ids[batch_samples + 2]) / batch_samples,
                "samples": (ids[:batch_samples] - 1).to(torch.int64).tolist() if indices is not None else None}
        self.last_commit = info
        self._mark_committed()
        if self.on_commit is not None and (g.rank == 0 or self.on_commit_all_ranks):
            self.on_commit(dict(info))
        self._save(info)
        elapsed = time.monotonic() - step_start
        self.step_seconds = elapsed if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * elapsed
        if timed:
            at = batch_samples + 3
            verdict = self.straggler.judge_groups(ids[at:at + timed].tolist(), ids[at + timed:at + 2 * timed].tolist(),
                                                  r.group_order, "batch to the end of its backward")
            if verdict is not None:
                return verdict
        if self.rendezvous is not None and int(ids[batch_samples]) > self.rendezvous.joins_seen:
            return None, "a worker asked to join"
        return None

    def _wait_for_siblings(self):
        """Every sibling is still in this generation (none left after a
        commit it lost, see the module's help): a watched wait before the
        forward pass, since FSDP's own collectives would wait for a sibling
        that left until their timeout. Started at the last commit, it has
        long completed by now unless a sibling left."""
        check, self._sibling_check = self._sibling_check, None
        if check is not None and check[0] is self.group.replica.siblings:
            check[1].wait()

    def _start_sibling_check(self):
        siblings = self.group.replica.siblings
        pending = siblings.allreduce_async(_torch().ones(1), "sum")
        if pending is not None:
            self._sibling_check = (siblings, pending)

    def _mark_committed(self):
        """Once a worker: a group started later knows from the store's mark
        that a state exists, and never starts afresh; and the launcher knows
        that this start of the replica group trained (``trained/<group>``:
        it stops restarting a group whose starts keep failing before that)."""
        if not self._marked_committed and self.rendezvous is not None:
            self.rendezvous.store.set("committed", "1")
            if self.rendezvous.replica is not None:
                self.rendezvous.store.set("trained/" + self.rendezvous.replica[0], "1")
            self._marked_committed = True

    def _commit_pending(self):
        """Commits the pending step: its gradient shards (None: a step the
        program committed without an optimizer step) and the optimizer's step."""
        step, flat, position = self.pending
        params = self._params()
        if flat is not None:
            unpack_local_gradients(_torch(), params, flat)
            self.optimizer.step()
        for p in params:
            p.grad = None
        self.pending = None
        self.step = step
        self.summary.steps += 1
        self.in_flight = False
        self.committed_position = position

    def _agree_and_sync_sharded(self):
        """Agree on the newest committed step; a worker that has its reduced
        shard for it commits it now; then, for each shard, whoever is behind
        (a new group) receives it from the lowest worker holding it."""
        torch = _torch()
        g = self.group
        r = g.replica
        _test_fault(g.generation)

        def reduce(group, value, op):
            return int(group.allreduce(torch.tensor([value], dtype=torch.int64), op)[0])

        hi = reduce(g, self.step, "max")
        late = self.pending is not None and self.pending[0] == hi and self.step == hi - 1
        if late:
            self._commit_pending()  # the others committed it: so every survivor has its reduced shard
            self.last_commit = None
        self.pending = None
        if self.extra_state is not None and reduce(g, int(late), "max"):
            # A late commit ran no program code after the optimizer's step (the Trainer's scheduler.step()):
            # the extra state comes from a worker that committed the step itself.
            self._sync_extra_state(reduce(g, g.rank if self.step == hi and not late else 1 << 30, "min"))
        lost = hi < 0 and self.rendezvous is not None and _peek(self.rendezvous.store, "committed") is not None
        if self.checkpoint_args is not None:
            self._choose_checkpoint_writer(reduce)
            restored = self._restore_sharded_checkpoint(reduce, hi, lost)
            if restored is not None:
                hi, lost = restored, False
        no_source = 1 << 30
        src = reduce(r, r.rank if self.step == hi else no_source, "min")
        if src == no_source:
            if hi >= 0:
                raise ElasticError("generation %d: no live worker holds shard %d of step %d (every group holding it "
                                   "failed at once)" % (g.generation, r.shard, hi))
            src = 0  # a fresh start: the first group's initialisation for every group
        if lost:
            raise ElasticError("generation %d: the job committed steps, but no live worker holds them (every replica "
                               "group failed); starting afresh would train its samples again%s" % (
                                   g.generation, "" if self.checkpoint_args is not None else
                                   " (with run(checkpointer=dict(directory=...)) the job resumes from its newest "
                                   "checkpoint instead)"))
        behind = reduce(r, int(self.step != hi or hi < 0), "max")
        if r.world_size > 1 and behind:
            self._broadcast_state(r, src)
        if self.rendezvous is not None:
            self.rendezvous.joins_seen = reduce(g, self.rendezvous.joins_seen, "max")
        self._reshard()
        if self.committed_position is not None:
            self.loader.load_state_dict(self.committed_position)
        # Rank 0 replays the last commit's report; one that committed it late (without the step's sample ids)
        # receives the report from the lowest rank that committed it in the step.
        holder = reduce(g, g.rank if self.last_commit is not None and self.last_commit.get("step") == hi
                        else no_source, "min")
        if holder != no_source and holder != 0 and hi >= 0:
            self.last_commit = _broadcast_object(g, self.last_commit if g.rank == holder else None, holder)
        if g.rank == 0 and self.last_commit is not None and self.on_commit is not None and \
                not self.on_commit_all_ranks:
            info = dict(self.last_commit)
            info["replayed"] = True
            self.on_commit(info)


    def _sync_extra_state(self, src):
        g = self.group
        if src == 1 << 30:
            if g.rank == 0:
                log.warning("generation %d: every worker holding step %d committed it late: the extra state (a "
                            "scheduler's) may be one step behind", g.generation, self.step)
            return
        payload = None
        if g.rank == src:
            import io
            buf = io.BytesIO()
            _torch().save(self.extra_state.state_dict(), buf)
            payload = buf.getvalue()
        data = broadcast_bytes(g, payload, src)
        if g.rank != src:
            self.extra_state.load_state_dict(load_from_peer(data))


def _broadcast_object(g, value, src):
    """``value`` (JSON: numbers, strings, lists, dicts) from rank ``src`` to every rank of ``g``."""
    import json
    return json.loads(broadcast_bytes(g, json.dumps(value).encode() if g.rank == src else None, src).decode())


def _copied(batch):
    def copy(value):
        return value.clone() if hasattr(value, "clone") else list(value) if isinstance(value, list) else value
    if isinstance(batch, dict):
        return {k: copy(v) for k, v in batch.items()}
    return tuple(copy(v) for v in batch)


def _offsets(sizes):
    at = 0
    for n in sizes:
        yield at, n
        at += n


def _torch():
    import torch
    return torch
