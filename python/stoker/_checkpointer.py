"""stoker.Checkpointer: saves in the background (stoker.checkpoint explains;
docs/checkpoint.md)."""
import threading

from . import _native
from . import _params
from . import _sharded
from .checkpoint import _capture_rng, _save_inputs, flatten, load_latest, parse_size


def _torch():
    import torch
    return torch


class Checkpointer:
    """Saves checkpoints to `directory` in the background.

    keep_last: keep the newest N checkpoints (None or 0: all); keep_best: also
    keep the best K by the `metric` given to save(), lowest first unless
    metric_mode="max". when_busy: "wait" for the previous persist, or "skip"
    the save (counted in stats()). The interval for due(): every_steps, or
    every_seconds, or mtbf_hours for Young/Daly's optimum from the measured
    checkpoint cost (starting at every_seconds, 30 minutes by default, until a
    checkpoint has been measured). max_file_size splits large states across
    files with a model.safetensors.index.json, as Hugging Face does. Saving a
    step whose step-N folder exists already (say, after resuming from an
    older checkpoint) raises FileExistsError unless replace_existing=True.

    Distributed jobs: `group` ("default": the initialised torch.distributed
    group, when it has more than one rank; None: this process alone; or a
    process group) makes the checkpoint sharded. Every rank of the group
    constructs the Checkpointer on the same directory (a file system all of
    them see) and calls save() together; each snapshots and writes only its
    own pieces in parallel, with no gather. Plain tensors are replicated
    (identical on every rank) and written once, their writes spread over
    the ranks; a ``stoker.Shard`` (or a DTensor or ShardedTensor) is the
    block of a global tensor this rank holds. Rank 0 publishes the step once
    every rank's files are durable (waiting at most `commit_timeout`
    seconds). load_latest(target=...) reads it back under any world size.

    replicate_to_peer=True (distributed only) also keeps each save in
    memory (Gemini-style): every rank copies the pieces it writes into its
    machine's /dev/shm (`peer_memory_dir`: elsewhere) and sends them to a
    peer on the next machine, which keeps them too, beside the persist, on
    a thread of its own. A restarted job restores from them with
    load_latest(..., from_peers=True) without reading storage, as long as
    no piece lost both holders. It costs twice the bytes this rank writes
    in memory; a failed copy is logged and counted in stats(), never raised.
    """

    def __init__(self, directory, keep_last=3, keep_best=0, metric_mode="min", when_busy="wait",
                 every_steps=None, every_seconds=None, mtbf_hours=None, max_file_size="4GiB", copy_threads=0,
                 replace_existing=False, group="default", commit_timeout=600, replicate_to_peer=False,
                 peer_memory_dir=None):
        _params.choice("metric_mode", metric_mode, ("min", "max"))
        _params.choice("when_busy", when_busy, ("wait", "skip"))
        if mtbf_hours is not None:
            interval, mtbf = "auto", _params.number("mtbf_hours", mtbf_hours, 0, 1e7, lo_open=True) * 3600
        elif every_seconds is not None:
            interval, mtbf = "seconds", 24 * 3600.0
        else:
            interval, mtbf = "steps", 24 * 3600.0
        if every_steps is not None and interval != "steps":
            raise ValueError("give one of every_steps, every_seconds or mtbf_hours")
        self.directory = str(directory)
        self._flat = _native.FlatState()
        self._flat_lock = threading.Lock()
        self._when_busy = when_busy
        self._interval = interval
        group = _sharded.Group.resolve(group)
        commit_timeout = _params.number("commit_timeout", commit_timeout, 0, 1e7, lo_open=True)
        self._group = None if group is None else _sharded.Group(group, self.directory, commit_timeout)
        self._plan_key, self._writes, self._written, self._saves, self._last_save = None, None, None, 0, None
        replicate_to_peer = _params.boolean("replicate_to_peer", replicate_to_peer)
        if replicate_to_peer and self._group is None:
            raise ValueError("replicate_to_peer=True copies each rank's pieces to a peer: it needs a distributed "
                             "group of more than one rank (group=)")
        self._peers = None
        self._native = _native.Checkpointer(
            self.directory, _params.optional_integer("keep_last", keep_last, 0, 1 << 31),
            _params.integer("keep_best", keep_best, 0, 1 << 31), metric_mode == "max", when_busy,
            parse_size(max_file_size), interval, _params.optional_integer("every_steps", every_steps, 1, 1 << 62,
                                                                          default=1000),
            _params.number("every_seconds", every_seconds if every_seconds is not None else 1800, 0, 1e9,
                           lo_open=True),
            mtbf, _params.integer("copy_threads", copy_threads, 0, 64),
            _params.boolean("replace_existing", replace_existing),
            0 if self._group is None else self._group.rank, 1 if self._group is None else self._group.world_size,
            commit_timeout, replicate_to_peer)
        self._commit_timeout = commit_timeout
        if self._group is not None:
            try:
                self._group.arrive()
                if replicate_to_peer:
                    from ._peer_copy import PeerCopies
                    self._peers = PeerCopies(self._group, self.directory, peer_memory_dir, commit_timeout)
            except BaseException:
                self._native.close()  # its rank's lock goes now, not when collected
                self._native = None
                raise

    # Distributed saves agree on time-based intervals this often (a tiny
    # gather), following rank 0's policy.
    AGREE_EVERY_STEPS = 50

    @property
    def rank(self):
        return 0 if self._group is None else self._group.rank

    @property
    def world_size(self):
        return 1 if self._group is None else self._group.world_size

    def due(self, step):
        """Whether the interval says to checkpoint at `step`. Distributed,
        every rank gets the same answer: step intervals are the same
        everywhere; time-based ones follow rank 0, asked every
        AGREE_EVERY_STEPS steps (all ranks call due() for the same steps)."""
        step = _params.integer("step", step, 0)
        if self._group is None or self._interval == "steps":
            return self._native.due(step)
        if step % self.AGREE_EVERY_STEPS:
            return False
        return bool(self._group.gather(self._native.due(step))[0])

    def save(self, step, state, loader=None, metric=None, extra=None, rng=True):
        """Snapshots `state` (nested dicts/lists/tuples of tensors and plain
        values) and returns True; False when when_busy="skip" found a persist
        still running. `loader`: a stoker.Loader (or its state_dict()) to
        resume exactly; `extra`: a JSON-able dict returned as Checkpoint.extra;
        `rng`: also save torch/Python/numpy RNG states. CUDA tensors are
        snapshotted by stoker with asynchronous device-to-host copies into
        its page-locked buffer (after torch's current stream finishes its
        queued work)."""
        if self._group is not None:
            return _sharded.save(self, step, state, loader, metric, extra, rng)
        loader_state, extra_json = _save_inputs(loader, extra)
        metadata = {"stoker.step": str(step)}
        # One FlatState reused from save to save (its storage kept); a save
        # made meanwhile from another thread gets one of its own.
        reuse = self._flat_lock.acquire(blocking=False)
        try:
            flat = flatten(state, into=self._flat if reuse else None)
            try:
                # GPU tensors are copied by stoker with asynchronous copies on
                # its own streams; the kernels that wrote them (queued on
                # torch's current streams) must have finished first.
                for device in flat.devices:
                    _torch().cuda.current_stream(device).synchronize()
                return self._native.save(int(step), flat, loader_state, _capture_rng() if rng else {}, metadata,
                                         None if metric is None else float(metric), extra_json)
            finally:
                flat.release()  # the snapshot is taken: the tensors are the caller's again
        finally:
            if reuse:
                self._flat_lock.release()

    def wait(self):
        """Blocks until the checkpoint being persisted is durable; raises if it
        failed. Distributed: until rank 0 has published it (or given up),
        and the in-memory copy on the peer is made (replicate_to_peer)."""
        if self._peers is not None:
            self._peers.wait()
        self._native.wait()
        if self._group is not None and self._group.rank != 0 and self._last_save is not None:
            step, save_id = self._last_save
            self._last_save = None
            _sharded.wait_published(self.directory, step, save_id, self._group.rank, self._commit_timeout)

    def load_latest(self, skip_corrupt=False, verify=True):
        """The newest complete checkpoint in this directory, or None."""
        return load_latest(self.directory, skip_corrupt=skip_corrupt, verify=verify)

    def stats(self):
        """Counters and timings: last_stall_s (what training waited),
        last_persist_s, skipped_busy, interval_s, expected_overhead, ...
        Distributed: this rank's (bytes_written: its own files), and rank
        and world_size."""
        stats = self._native.stats()
        if self._group is not None:
            stats["rank"], stats["world_size"] = self._group.rank, self._group.world_size
            stats["skipped_busy"] += getattr(self, "_skipped_together", 0)
            if self._peers is not None:
                stats.update(self._peers.stats)
        return stats

    def close(self):
        """Waits for the persist in flight and releases the directory."""
        if self._native is not None:
            try:
                if self._peers is not None:
                    self._peers.wait()
                self._native.wait()
            finally:
                self._native.close()
                self._native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
