"""The runner's step for a model whole on every worker (see _runner.py):
the program's forward and backward passes over this rank's share, then one
all-reduce of the gradients, flags and loss (_reduce.py) and one of the
sample ids, presence count and pending joins; the commit is the second.
Mixed into _Runner, whose attributes it uses."""
import time

from . import ElasticError
from ._batches import slice_batch
from ._membership import _test_stall
from ._reduce import pack_gradients, unpack_gradients


class ReplicatedSteps:
    def _replicated_step(self, torch, epoch, batch_index, num_samples):
        g = self.group
        batch_samples, first, end, batch, samples, indices, began = self._take_batch(batch_index, num_samples)
        params = self._params()
        for p in params:
            p.grad = None
        device = params[0].device if params else torch.device("cpu")
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)  # on the device: no host sync a step
        at = 0
        step_start = time.monotonic()
        for n in self.policy.micro_batches(samples):
            part = slice_batch(batch, at, at + n)
            loss = self.train_step(part) if isinstance(part, dict) else self.train_step(*part)
            (loss * (n / batch_samples)).backward()
            loss_sum += loss.detach().double() * n
            at += n
        own_time = time.monotonic() - began  # this rank's own time: batch to backward's end, before any wait
        flat = pack_gradients(torch, params, loss_sum, device)
        timed = self.straggler.slots(g.world_size) if self.straggler is not None else 0
        ids = torch.zeros(batch_samples + 2 + timed, dtype=torch.int64)
        if timed:
            self.straggler.write(ids, batch_samples + 2, g.rank, own_time)
        if indices is not None:
            ids[first:end] = indices.cpu().to(torch.int64) + 1
        if g.rank == 0 and self.rendezvous is not None:
            ids[batch_samples] = self.rendezvous.pending_joins()
        ids[batch_samples + 1] = 1  # ranks present: a sum check that everyone took part
        g.allreduce(flat, "sum")
        _test_stall(self.step + 1)
        g.allreduce(ids, "sum")
        if int(ids[batch_samples + 1]) != g.world_size:
            raise ElasticError("%d ranks took part in step %d, the group has %d" % (int(ids[batch_samples + 1]),
                                                                                  self.step + 1, g.world_size))
        self._refuse_commit_if_away(began)
        # Committed from here: every rank that got here has the same reduced gradient.
        unpack_gradients(params, flat)
        self.optimizer.step()
        for p in params:
            p.grad = None
        self.step += 1
        self.summary.steps += 1
        self.in_flight = False
        self.committed_position = self.loader.state_dict()
        info = {"step": self.step, "epoch": epoch, "batch": batch_index, "world_size": g.world_size,
                "rank": g.rank, "loss": float(flat[-1]) / batch_samples,
                "samples": (ids[:batch_samples] - 1).tolist() if indices is not None else None}
        self.last_commit = info
        if self.on_commit is not None and (g.rank == 0 or self.on_commit_all_ranks):
            self.on_commit(dict(info))
        elapsed = time.monotonic() - step_start
        self.step_seconds = elapsed if self.step_seconds is None else 0.9 * self.step_seconds + 0.1 * elapsed
        self._save(info)
        if timed:
            verdict = self.straggler.judge(ids[batch_samples + 2:].tolist(), "batch to the end of its backward")
            if verdict is not None:
                return verdict
        if self.rendezvous is not None and int(ids[batch_samples]) > self.rendezvous.joins_seen:
            return None, "a worker asked to join"
        return None
