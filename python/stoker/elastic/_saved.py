"""Saved states of an elastic run on this machine: where they are (the
agents' in-memory snapshot folders and the user's checkpoint folder), the
newest step among them, the newest readable one (a corrupt one is moved
aside and named), and the snapshot folders of agents that no longer run."""
import logging
import os
import shutil
import socket
import time

log = logging.getLogger("stoker.elastic")

# The share of step time that in-memory snapshots may cost (the wait and the
# background write, measured); the commit's collective takes about as much.
SNAPSHOT_SHARE = 0.005


def saved_dirs(snapshot_base, checkpoint_dir):
    dirs = []
    if snapshot_base and os.path.isdir(snapshot_base):
        dirs += [os.path.join(snapshot_base, d) for d in sorted(os.listdir(snapshot_base))]
    if checkpoint_dir is not None:
        dirs.append(checkpoint_dir)
    return dirs


def newest_step(dirs):
    from ..checkpoint import list_checkpoints
    best = None
    for d in dirs:
        try:
            steps = [c["step"] for c in list_checkpoints(d)]
        except Exception:
            continue
        if steps and (best is None or max(steps) > best):
            best = max(steps)
    return best


def load_newest(dirs):
    """The newest readable saved state in `dirs` (a stoker.Checkpoint), or
    None; a corrupt one is named in the log, moved aside and an older one used."""
    from ..checkpoint import load_latest
    candidates = []
    for d in dirs:
        try:
            c = load_latest(d, skip_corrupt=True)
        except Exception as e:  # nothing readable there at all
            log.warning("no usable state in %s: %s", d, e)
            continue
        if c is None:
            continue
        for skipped in c.skipped:
            log.warning("skipped a corrupt saved state: %s", skipped)
            path = skipped.split(": ", 1)[0]
            if os.path.isdir(path):
                # Kept for inspection, out of the way of this step's next save.
                aside = "%s.corrupt-%d" % (path, int(time.time()))
                try:
                    os.rename(path, aside)
                    log.warning("moved it to %s", aside)
                except OSError as e:
                    log.warning("could not move it aside: %s", e)
        candidates.append(c)
    return max(candidates, key=lambda c: c.step) if candidates else None


def remove_dead_agents_snapshots(base):
    """Snapshot folders of agents on this machine that no longer run (killed
    ones leave theirs behind)."""
    host = socket.gethostname()
    try:
        entries = os.listdir(base)
    except OSError:
        return
    for name in entries:
        owner, _, rest = name.rpartition("-local")
        agent_host, _, pid = owner.rpartition("-")
        if agent_host != host or not pid.isdigit():
            continue
        if not _process_runs(int(pid)):
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    try:
        os.rmdir(base)
    except OSError:
        pass


def _process_runs(pid):
    """Whether process `pid` exists and is not a zombie (a killed agent its parent has not reaped yet)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
    except OSError:
        return True


class Saving:
    """The runner's saved states: in-memory snapshots (torchrun mode) and the
    persistent checkpointer (whichever process is rank 0), and restoring the
    newest of them. Mixed into _Runner, whose attributes it uses."""

    def _saved_dirs(self):
        return saved_dirs(self.snapshot_base, self.checkpoint_dir)

    def _newest_saved_step(self):
        return newest_step(self._saved_dirs())

    def _load_saved(self):
        """Restores the newest readable saved state (a snapshot or a checkpoint)."""
        c = load_newest(self._saved_dirs())
        if c is None:
            return
        meta = (c.extra or {}).get("stoker_elastic") or {"step": c.step}
        meta["step"] = c.step
        log.info("restoring step %d from %s", c.step, c.path)
        self._apply(c.state, c.loader_state, meta)

    def _own_checkpointer(self):
        """The persistent checkpointer when this process is rank 0, else None."""
        if self.checkpoint_args is None:
            return self.checkpointer if self.group.rank == 0 else None
        if self.group.rank != 0:
            if self.checkpointer is not None:
                self.checkpointer.close()
                self.checkpointer = None
            return None
        if self.checkpointer is None:
            from .. import StokerError
            from ..checkpoint import Checkpointer
            try:
                self.checkpointer = Checkpointer(**dict(self.checkpoint_args, group=None))
            except StokerError as e:  # e.g. a hung former rank 0 still holds the directory
                log.warning("no persistent checkpoint this step: %s", e)
                return None
        return self.checkpointer

    def _snapshot_due(self):
        """Every ``snapshot_every`` steps, or, by default, as often as keeps a
        snapshot's whole cost (the training thread's wait plus its
        background write, which competes for the CPU with the loader and
        the training) within half a percent of step time (the other half of
        the 1% an elastic step may cost is the commit's), and at least every 30 s of
        training (the work a restart may redo). Measured from the last
        snapshot; the first step is always snapshotted."""
        if self.snapshots is None:
            return False
        if self.snapshot_every is not None:
            return (self.step + 1) % self.snapshot_every == 0
        if self.snapshot_cost is None or not self.step_seconds:
            return True
        try:
            persist = float(self.snapshots.stats().get("last_persist_s") or 0.0)
        except Exception:  # noqa: BLE001 - a test double without stats
            persist = 0.0
        interval = max(1, int((self.snapshot_cost + persist) / (SNAPSHOT_SHARE * self.step_seconds) + 0.999))
        interval = min(interval, max(1, int(30.0 / self.step_seconds)))
        return self.step - self.last_snapshot_step >= interval

    def _save(self, info):
        if self.sharded:  # no snapshots (in-process mode only); the writing group's sharded checkpoints
            return self._save_sharded_checkpoint()
        need_snapshot = self._snapshot_due()
        ckpt = self._own_checkpointer()
        need_ckpt = ckpt is not None and ckpt.due(self.step)
        if not (need_snapshot or need_ckpt):
            return
        state = self._state()
        extra = {"stoker_elastic": self._meta()}
        if need_snapshot:
            start = time.monotonic()
            self.snapshots.save(self.step, state, loader=self.loader, extra=extra, rng=False)
            self.snapshot_cost = time.monotonic() - start
            self.last_snapshot_step = self.step
        if need_ckpt:
            start = time.monotonic()
            ckpt.save(self.step, state, loader=self.loader, extra=extra)
            self.summary.checkpoint_seconds.append(time.monotonic() - start)

    def _close(self, finished):
        if self.checkpoint_args is not None and self.checkpointer is not None:
            self.checkpointer.close()  # opened here: the last persist becomes durable
        if self.snapshots is not None:
            self.snapshots.close()
            if finished:  # the snapshots served their purpose; tmpfs is memory
                shutil.rmtree(self.snapshot_own, ignore_errors=True)
                remove_dead_agents_snapshots(self.snapshot_base)
        self._release_groups()
        if self.rendezvous is not None:
            self.rendezvous.close()
