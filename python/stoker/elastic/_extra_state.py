"""The Trainer's extra state: the program's LR scheduler and GradScaler,
whose states travel with the model (snapshots, checkpoints, a joiner's
hand-over), and what a failed step must undo in the scaler."""
import collections


class ExtraState:
    """The scheduler's and the scaler's states, travelling with the model."""

    def __init__(self, scheduler, scaler):
        self.scheduler, self.scaler = scheduler, scaler

    @property
    def base_lrs(self):
        return getattr(self.scheduler, "base_lrs", None)

    @base_lrs.setter
    def base_lrs(self, value):
        self.scheduler.base_lrs = value

    def state_dict(self):
        state = {}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        return state

    def load_state_dict(self, state):
        if self.scheduler is not None and "scheduler" in state:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])

    def abandon_step(self):
        """Forgets what the scaler noted of a step that failed (its batch is
        taken again). A failure between ``scaler.unscale_(optimizer)`` and
        ``scaler.update()`` (the commit's collective, inside
        ``scaler.step()``) leaves the optimizer marked as unscaled, and the
        retried batch's ``unscale_`` would raise "unscale_() has already
        been called on this optimizer since the last update()" in the
        program's loop. update() clears that mark the same way; the scale
        itself is left alone (the step found no inf: it failed)."""
        states = getattr(self.scaler, "_per_optimizer_states", None)
        if isinstance(states, collections.defaultdict) and states.default_factory is not None:
            self.scaler._per_optimizer_states = collections.defaultdict(states.default_factory)
