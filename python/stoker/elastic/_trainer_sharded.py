"""stoker.elastic.Trainer's part for a model sharded within replica groups
(FSDP2 over replica_group_mesh(); see _sharded.py and _sharded_steps.py).
Mixed into Trainer, whose attributes it uses.

The program's loop is the one it writes for DDP, and ``trainer.model`` is
the sharded module itself. FSDP2 reduce-scatters the gradients within the
group in the backward pass; the trainer sums each gradient shard across the
groups as soon as the last micro-batch of ``trainer.accumulate()`` has run
its backward pass, so that clipping, and whatever else reads gradients,
sees the whole global batch's (a loop without accumulate() gets the sum at
``optimizer.step()``). The commit's collective runs after that sum, not
early as with DDP: a worker that completed it knows that every worker summed
its shards, which is what lets a worker that missed the commit commit the
same step later, from its own copy of the gradient shards as the program
left them (clipped). Such a late commit runs none of the program's code
after ``optimizer.step()``: the scheduler's state then comes from a worker
that committed the step itself (_sharded_steps.py).
"""
import contextlib
import logging
import os
import time

from . import ElasticError, PeerFailure
from ._batches import slice_batch
from ._sharded import pack_local_gradients, unpack_local_gradients
from ._membership import _test_lost_commit
from ._sharded_steps import _copied

log = logging.getLogger("stoker.elastic")


class ShardedTrainer:
    _reduced = False  # this batch's gradient shards are summed across the groups
    _filler = None  # one sample of an earlier batch (a raw loader item), for a worker whose share is empty
    _filler_active = False

    @property
    def _sharded(self):
        return self._r.sharded

    def _share_scaler_decisions(self, scaler):
        """With a sharded model, a GradScaler's unscale_() (the program's, or
        the one scaler.step() makes) first sums the gradient shards across
        the groups, then finds inf over the whole gradient, not this
        worker's shard of it. So every worker skips, or steps, alike: one
        shard stepping while another skips would tear the model apart."""
        if not self._sharded or scaler is None:
            return
        trainer, original = self, getattr(scaler, "unscale_", None)
        if original is None:  # not torch's: its own way of skipping, which must agree across the workers
            log.warning("the scaler (%s) has no unscale_(): with a sharded model each worker sees only its shard "
                        "of the gradient, so a skip must be decided on the whole of it (torch's GradScaler is)",
                        type(scaler).__name__)
            return

        def unscale_(optimizer):
            if trainer._batch is not None and not trainer._committed:
                trainer._reduce_across_groups()  # the inf check must see the whole batch's gradient
            original(optimizer)
            if not _dtensor_shares_found_inf():
                trainer._share_found_inf(scaler, optimizer)
        scaler.unscale_ = unscale_  # scaler.step() calls self.unscale_: this one

    def _share_found_inf(self, scaler, optimizer):
        """For a torch whose DTensors do not reduce the scaler's inf check
        over the mesh: the largest found_inf of the group's workers (those of
        other groups hold the same summed shards). Raises PeerFailure."""
        import torch
        state = scaler._per_optimizer_states.get(id(optimizer)) if getattr(scaler, "_enabled", True) else None
        found = (state or {}).get("found_inf_per_device")
        if not found:
            return
        flag = torch.tensor([max(float(v.item()) for v in found.values())])
        self._r.group.replica.siblings.allreduce(flag, "max")
        for v in found.values():
            v.fill_(float(flag[0]))

    def _sharded_item(self, item, samples):
        """What the program gets for this batch: its share, or, when the share
        is empty (a last batch smaller than the world), one sample of an
        earlier batch whose loss_weight() is 0, since FSDP's collectives
        need every worker of the group in the forward and backward passes."""
        self._reduced = False
        if samples:
            self._filler = _copied(slice_batch(item, 0, 1) if isinstance(item, dict) else
                                   tuple(t[0:1] for t in item))  # the loader reuses its buffers
            self._filler_active = False
            return item
        if self._filler is None:
            raise ElasticError("rank %d has no sample in this batch and none from an earlier batch to run its "
                               "model's sharded passes on (give the epoch's first batch at least one sample a "
                               "worker)" % self._r.group.rank)
        self._filler_active = True
        return self._filler

    def _sharded_sync(self, last):
        """FSDP2's counterpart of DDP's no_sync(): no reduce-scatter for a
        micro-batch but the last (the gradients accumulate unsharded)."""
        if last:
            return contextlib.nullcontext()
        return _gradient_sync_off(self.module)

    def _reduce_across_groups(self):
        """Sums this batch's gradient shards across the replica groups, once.
        Raises PeerFailure."""
        if self._reduced:
            return
        import torch
        r = self._r
        self._own_time = time.monotonic() - self._handed_out  # the straggler policy's clock: to backward's end
        params = r._params()
        flat = pack_local_gradients(torch, params, r.group.replica.group_size, r._device())
        r.group.replica.allreduce(flat, "sum")
        unpack_local_gradients(torch, params, flat)
        self._reduced = True

    def _commit_sharded(self, stepped):
        """Before the optimizer's step (``stepped``) or at the end of a body
        without one: the sum across groups if accumulate() did not make it,
        this worker's copy of the shards to commit late, then the commit's
        collective over every worker (started here). Raises PeerFailure."""
        import torch
        r = self._r
        if self._failure is not None:
            raise self._failure
        flat = None
        if stepped:
            self._reduce_across_groups()
            flat = pack_local_gradients(torch, r._params(), 1, r._device())  # as the program left them
        r.pending = (r.step + 1, flat, r.loader.state_dict())
        self._start_ids()
        if self._failure is not None:
            raise self._failure
        pending, self._ids_pending = self._ids_pending, None
        if pending is not None:
            pending.wait()  # a failure here keeps r.pending: the others may have committed
        _test_lost_commit(r.step + 1)
        try:
            batch_samples = self._batch[2]
            if int(self._ids[batch_samples + 1]) != r.group.world_size:
                raise PeerFailure("%d ranks took part in step %d, the group has %d" % (
                    int(self._ids[batch_samples + 1]), r.step + 1, r.group.world_size))
            r._refuse_commit_if_away(self._handed_out)
        except BaseException:
            r.pending = None  # what it would commit may mix halves the others abandoned
            raise
        r.pending = None

    def _siblings_ready(self):
        """Before a batch is taken: False (the failure noted) when a sibling
        left the generation (see ShardedSteps._wait_for_siblings)."""
        try:
            self._r._wait_for_siblings()
        except PeerFailure as e:
            self._failure = e
            return False
        return True

    def _after_sharded_commit(self):
        r = self._r
        r._start_sibling_check()
        r._mark_committed()


def _dtensor_shares_found_inf():
    """Whether torch's DTensors reduce a GradScaler's inf check over their
    mesh themselves (torch.distributed.tensor's found_inf handler, in torch
    2.9; probed, as it is torch's internal)."""
    if os.environ.get("STOKER_ELASTIC_TEST_OWN_FOUND_INF"):
        _test_drop_torchs_found_inf()
        return False
    try:
        from torch.distributed.tensor import _dispatch
    except Exception:  # noqa: BLE001 - absent or moved: reduce it here
        return False
    return hasattr(_dispatch, "found_inf_reduce_handler")


def _test_drop_torchs_found_inf():
    """The tests' way to run the trainer's own reduction of the inf check as
    on a torch without DTensor's: torch's handler is removed, so that the
    check is this worker's shard's alone unless the trainer reduces it."""
    import torch
    from torch.distributed.tensor import DTensor
    handlers = getattr(DTensor._op_dispatcher, "_custom_op_handlers", {})
    handlers.pop(torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default, None)


def _gradient_sync_off(module):
    """Turns FSDP2's gradient reduction off on every sharded module of
    ``module`` for the ``with`` block."""
    modules = [m for m in module.modules() if hasattr(m, "set_requires_gradient_sync")]

    @contextlib.contextmanager
    def off():
        for m in modules:
            m.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for m in modules:
                m.set_requires_gradient_sync(True, recurse=False)
    return off()
