"""How a global batch is split across a changing number of ranks, and what
happens to the learning rate when the global batch itself changes.

The rule (documented in the README's "Elastic training"):

- The global batch B stays the same whatever the world size W. Rank r of W
  takes the contiguous samples [floor(r*b/W), floor((r+1)*b/W)) of a global
  batch of b samples (b = B except for the epoch's short last batch): shares
  differ by at most one sample, nothing is padded or dropped, and a rank may
  get no sample at all (it still takes part in the gradient reduction).
- Each rank scales its mean loss by (its samples / b) before backward, so
  the summed gradient is the mean over the global batch, the same for any W.
- A share larger than ``max_rank_batch`` is processed in micro-batches of at
  most that many samples, accumulating gradients (memory stays bounded when
  the world shrinks).
- A schedule may change B at epoch boundaries ({epoch: B}); ``lr_rule``
  ("linear" or "sqrt") then rescales the learning rate by B/B0 or
  sqrt(B/B0) from the first stage's B0, logged on every change.
"""
import logging
import math

__all__ = ["BatchPolicy", "StragglerPolicy", "rank_share"]

_LR_RULES = (None, "linear", "sqrt")


def rank_share(batch, world_size, rank):
    """(first, end) positions of rank ``rank``'s share of a global batch of ``batch`` samples."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError("rank %d is out of range for world size %d" % (rank, world_size))
    return rank * batch // world_size, (rank + 1) * batch // world_size


class BatchPolicy:
    """``global_batch``: samples per optimizer step, whatever the world size.
    ``schedule``: optional {epoch: global_batch} stages (epoch 0 defaults to
    ``global_batch``). ``lr_rule``: None, "linear" or "sqrt". ``max_rank_batch``:
    the most samples one forward pass takes (None: the whole share)."""

    def __init__(self, global_batch, schedule=None, lr_rule=None, max_rank_batch=None):
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError("global_batch must be a positive integer, not %r" % (global_batch,))
        stages = {0: global_batch}
        for epoch, batch in (schedule or {}).items():
            if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
                raise ValueError("schedule keys are epochs (integers >= 0), not %r" % (epoch,))
            if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
                raise ValueError("schedule[%d] must be a positive integer global batch, not %r" % (epoch, batch))
            stages[epoch] = batch
        if lr_rule not in _LR_RULES:
            raise ValueError("lr_rule must be one of None, 'linear', 'sqrt', not %r" % (lr_rule,))
        if max_rank_batch is not None and (not isinstance(max_rank_batch, int) or max_rank_batch < 1):
            raise ValueError("max_rank_batch must be a positive integer or None, not %r" % (max_rank_batch,))
        self._stages = sorted(stages.items())
        self.lr_rule = lr_rule
        self.max_rank_batch = max_rank_batch

    @property
    def base_batch(self):
        return self._stages[0][1]

    @property
    def largest_batch(self):
        return max(b for _, b in self._stages)

    def global_batch_at(self, epoch):
        batch = self._stages[0][1]
        for start, b in self._stages:
            if start <= epoch:
                batch = b
        return batch

    def lr_factor(self, global_batch):
        """The learning-rate multiplier for ``global_batch`` relative to the first stage's."""
        ratio = global_batch / self.base_batch
        if self.lr_rule == "linear":
            return ratio
        if self.lr_rule == "sqrt":
            return math.sqrt(ratio)
        return 1.0

    def micro_batches(self, samples):
        """Sizes of the forward passes for a share of ``samples`` samples."""
        if samples == 0:
            return []
        step = self.max_rank_batch or samples
        return [min(step, samples - i) for i in range(0, samples, step)]

    def __repr__(self):
        return "BatchPolicy(stages=%r, lr_rule=%r, max_rank_batch=%r)" % (self._stages, self.lr_rule,
                                                                         self.max_rank_batch)


def apply_lr_factor(optimizer, old_factor, new_factor, reason, scheduler=None):
    """Scales each param group's lr by new_factor / old_factor (keeping
    whatever a scheduler did to it), and a scheduler's ``base_lrs`` the
    same way so that its later steps keep the factor; logs the change."""
    ratio = new_factor / old_factor
    if ratio == 1.0:
        return
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * ratio
        if "initial_lr" in group:  # what a scheduler made at its start reads back
            group["initial_lr"] = group["initial_lr"] * ratio
    base_lrs = getattr(scheduler, "base_lrs", None)
    if isinstance(base_lrs, list):
        scheduler.base_lrs = [lr * ratio for lr in base_lrs]
    logging.getLogger("stoker.elastic").info("learning rate x%.4g (%s): %s", new_factor, reason,
                                             ", ".join("%.6g" % g["lr"] for g in optimizer.param_groups))


class StragglerPolicy:
    """When a worker counts as a straggler, and what is done about it
    (stoker.elastic.Trainer(straggler=...) or run(straggler=...); evicting
    needs the in-process mode).

    A rank's time for a step is its own: from asking the loader for the
    batch to the moment its backward pass computed its last gradient (tensor
    hooks on the parameters; under run(), when its backward pass returns,
    before the reduction), so the time DDP spends waiting for a slow peer
    is not in it, and a slow loader or a slow device is (a collective in the
    forward pass, such as DDP's buffer broadcast or its one bucket rebuild
    in the second iteration, makes the others wait there, which ends a
    streak). The ranks exchange these times inside the
    commit's collective (no message of its own), so every rank reaches the
    same decision at the same step. A rank whose time exceeds ``factor``
    times the median of the others' for ``steps`` committed steps in a row
    is a straggler: ``action="evict"`` makes it leave (the others re-form
    without it at once, as after a failure but without waiting for a
    timeout; not below the launcher's minimum of workers, then it is only
    named), ``action="warn"`` only names it in a warning, every ``steps``
    steps while it lasts. Steps whose times are below ``min_seconds`` are
    not judged (tiny steps are noise)."""

    def __init__(self, factor=1.5, steps=50, action="evict", min_seconds=0.0):
        if not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 1:
            raise ValueError("StragglerPolicy(factor=%r): a number above 1 (1.5: 50%% slower than the others)"
                             % (factor,))
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError("StragglerPolicy(steps=%r): a positive number of steps" % (steps,))
        if action not in ("evict", "warn"):
            raise ValueError("StragglerPolicy(action=%r): 'evict' or 'warn'" % (action,))
        if not isinstance(min_seconds, (int, float)) or not min_seconds >= 0:
            raise ValueError("StragglerPolicy(min_seconds=%r): a number of seconds >= 0" % (min_seconds,))
        self.factor, self.steps, self.action, self.min_seconds = float(factor), steps, action, float(min_seconds)
        self.reset()

    @classmethod
    def from_spec(cls, spec, action="evict"):
        """From a command line's "FACTOR:STEPS[:MIN_SECONDS]" ("1.5:50")."""
        parts = str(spec).split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError
            return cls(float(parts[0]), int(parts[1]), action, float(parts[2]) if len(parts) == 3 else 0.0)
        except ValueError as e:
            raise ValueError("straggler %r: FACTOR:STEPS[:MIN_SECONDS], as 1.5:50 or 1.5:50:0.1%s" % (
                spec, " (%s)" % e if str(e) else "")) from None

    def __repr__(self):
        return "StragglerPolicy(factor=%g, steps=%d, action=%r, min_seconds=%g)" % (
            self.factor, self.steps, self.action, self.min_seconds)

    def reset(self):
        """Forgets the streak (the group changed: ranks mean other workers)."""
        self._rank, self._count, self._ratios = None, 0, []

    def observe(self, times):
        """`times`: each rank's own time for one step, in seconds (None:
        unknown). Returns (rank, ratio to the others' median, averaged over
        the streak) when a streak of ``steps`` completes, else None."""
        known = [(t, r) for r, t in enumerate(times) if t is not None]
        if len(known) < 2 or len(known) != len(times):
            self.reset()
            return None
        slowest, rank = max(known)
        others = sorted(t for t, r in known if r != rank)
        middle = len(others) // 2
        median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        if slowest < self.min_seconds or median <= 0 or slowest <= self.factor * median:
            self.reset()
            return None
        if rank != self._rank:
            self._rank, self._count, self._ratios = rank, 0, []
        self._count += 1
        self._ratios.append(slowest / median)
        if self._count < self.steps:
            return None
        ratio = sum(self._ratios) / len(self._ratios)
        self.reset()
        return rank, ratio
