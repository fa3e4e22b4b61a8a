"""The straggler policy's part of a step, shared by run() and Trainer: each
rank's own time travels in the commit's collective (one int64 slot per
rank, summed, so every rank reads every rank's), the policy judges the same
list on every rank, and the verdict is carried out alike everywhere: the
straggler leaves (marked gone in the store, so the others re-form at once),
the others re-form without it."""
import logging

log = logging.getLogger("stoker.elastic")


class StragglerWatch:
    def __init__(self, policy, runner):
        self.policy, self.runner = policy, runner
        self._generation = None  # the group the streak was counted in

    def slots(self, world_size):
        """How many int64 slots the commit's collective carries for the times."""
        return world_size if world_size > 1 else 0

    @staticmethod
    def write(ids, offset, rank, seconds):
        """This rank's own time into its slot (microseconds; 0 means unknown)."""
        if seconds is not None:
            ids[offset + rank] = max(1, int(seconds * 1e6))

    def judge(self, micros, clock):
        """At a commit: every rank's own time (the same list on every rank,
        in microseconds). Returns (rank, why) when that rank is to be
        evicted, else None (warnings, and a straggler kept because of the
        mode or the minimum, are logged by rank 0). ``clock`` names what was
        timed, for the messages."""
        return self._judge([m / 1e6 if m > 0 else None for m in micros], clock, lambda rank: "rank %d" % rank, 1)

    def judge_groups(self, micros, group_of, own_group, clock):
        """judge() for a model sharded in replica groups: ``group_of[rank]``
        is each rank's group (+1, as the commit's collective carried it). A
        group's time is its slowest worker's (FSDP's collectives hold its
        other workers to it), and a straggling group leaves whole. Returns
        (this worker's rank when its group is evicted, else None, why), or None."""
        members = {}
        for rank, group in enumerate(group_of):
            members.setdefault(int(group), []).append(rank)
        groups = sorted(members)
        times = [None if any(micros[k] <= 0 for k in members[gr]) else max(micros[k] for k in members[gr]) / 1e6
                 for gr in groups]
        verdict = self._judge(times, clock, lambda i: "the replica group of ranks %s" % ", ".join(
            map(str, members[groups[i]])), len(members[groups[0]]))
        if verdict is None:
            return None
        index, why = verdict
        return (self.runner.group.rank if groups[index] == own_group + 1 else None), why

    def _judge(self, times, clock, name, leaving):
        """The verdict on ``times`` (seconds, one per rank or group; None:
        unknown): (index, why) to evict, else None. ``name(index)`` names one
        in messages; ``leaving``: the workers an eviction removes."""
        r, g = self.runner, self.runner.group
        if g.generation != self._generation:  # the ranks are other workers now
            self.policy.reset()
            self._generation = g.generation
        verdict = self.policy.observe(times)
        if verdict is None:
            return None
        rank, ratio = verdict
        why = ("%s was a straggler: its own time (%s) was %.2fx the others' median for %d steps in a row"
               % (name(rank), clock, ratio, self.policy.steps))
        if self.policy.action == "warn":
            if g.rank == 0:
                log.warning("%s (StragglerPolicy(action='warn'): it stays)", why)
            return None
        if r.mode != "in_process":
            if g.rank == 0:
                log.warning("%s; it stays: evicting needs the in-process mode (stoker.elastic.launch --in-process)",
                            why)
            return None
        minimum = r.rendezvous.min_size if r.rendezvous is not None else 1
        if g.world_size - leaving < minimum:
            if g.rank == 0:
                log.warning("%s; it stays: without it the group would have %d workers, below the minimum %d", why,
                            g.world_size - leaving, minimum)
            return None
        return rank, why + "; it is evicted"

    def leave(self, why):
        """This worker was judged a straggler: it leaves the job. Marked gone
        in the store, so the others re-form at once without waiting for it."""
        r = self.runner
        r.summary.evicted = why
        if r.checkpoint_args is not None and r.checkpointer is not None:
            # Closed (its last save durable, its directory free) before the others learn this worker left: one
            # of them opens it next.
            r.checkpointer.close()
            r.checkpointer = None
        log.warning("rank %d of %d: %s; this worker leaves the job", r.group.rank, r.group.world_size, why)
        if r.rendezvous is not None:
            r.rendezvous.store.set("dead/" + r.rendezvous.id, "evicted as a straggler")
