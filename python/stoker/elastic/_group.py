"""Process groups that can be re-formed: the collectives stoker.elastic uses
(gloo, or NCCL where asked, and a small gloo group of the commit's own),
each failure a PeerFailure, waits that watch the members (the in-process
rendezvous, _rendezvous.py, gives the watch)."""
import collections
import datetime
import gc
import logging
import os
import socket
import time

from . import PeerFailure

log = logging.getLogger("stoker.elastic")


class JobFinished(Exception):
    """The group finished the job while this worker was away (hung, or a
    joiner that came too late): there is no group left to join."""


def _dist():
    import torch.distributed as dist
    return dist


class Group:
    """A process group of ``world_size`` ranks with the few collectives the
    runner needs; any of them raises PeerFailure on a peer's failure or after
    ``timeout``. With ``watch`` (a function returning why a member is gone,
    or None), a collective that waits is checked every ``poll`` seconds, so
    a dead, hung or cut-off peer is noticed within the heartbeat timeout
    whatever the collective timeout; the failure then says the collective
    was left in flight (``PeerFailure.in_flight``): its group must not be
    destroyed before gloo's own timeout ends it, or the destructor waits
    for it."""

    def __init__(self, pg, rank, world_size, generation, watch=None, poll=0.5, device_pg=None, probe=None,
                 commit_pg=None, owns_device_pg=False):
        self.pg, self.rank, self.world_size, self.generation = pg, rank, world_size, generation
        # The in-process mode makes a device group per generation (and aborts it on failure); torchrun's is the
        # program's own default group, never aborted here.
        self.owns_device_pg = owns_device_pg
        self.watch, self.poll = watch, poll
        # The commit's small collective runs on a gloo group of its own: on ``pg`` it would queue beside
        # DDP's all-reduce (measured: +3% of a 63 ms step on 3 CPU workers, +0.7% on its own group).
        self.commit_pg = commit_pg
        self.probe = probe if probe is not None else watch  # the watch's answer, asked of the store now
        # A device group (the program's NCCL group) takes the CUDA tensors; ``pg`` (gloo) the host's.
        self.device_pg = device_pg
        # The host tensors of the last few collectives (a step's gradients and ids, the commit's), held until
        # the process groups are gone: see close(). Few, since each may be as large as the model's gradients.
        self._used = collections.deque(maxlen=3)
        # With replica groups (a sharded model): the Group of the workers holding this worker's shard.
        self.replica = None

    def close(self):
        """Drops the host process groups, then the tensors of the last
        collectives. A gloo thread lets go of a finished collective a moment
        after wait() returns; were it the tensor's last owner, freeing it
        would take the GIL (torch 2.x ties a tensor to its Python object),
        which the group's destructor, joining that thread, holds: a
        deadlock, seen at a re-formation on torch 2.5."""
        if self.replica is not None:
            if getattr(self.replica, "siblings", None) is not None:
                self.replica.siblings.close()
            self.replica.close()
        self.pg = self.commit_pg = None
        gc.collect()
        self._used.clear()

    def _hold(self, tensor):
        if not getattr(tensor, "is_cuda", False):  # gloo's threads; CUDA tensors go to the device group
            self._used.append(tensor)

    def _for(self, tensor):
        return self.device_pg if self.device_pg is not None and getattr(tensor, "is_cuda", False) else self.pg

    def _wait(self, work):
        if self.watch is None:
            work.wait()
            return
        # Short slices: the watch answers from memory (the heartbeat thread asks the store), so looking
        # often costs nothing; it asks for members to be checked only once a wait lasts `poll` seconds.
        slice_ = datetime.timedelta(seconds=min(self.poll, 0.1))
        start = time.monotonic()
        while True:
            try:
                work.wait(slice_)
                return
            except RuntimeError as e:
                if "Operation timed out!" not in str(e):  # the collective itself failed
                    raise
            gone = self.watch(time.monotonic() - start >= self.poll)
            if gone is not None:
                failure = PeerFailure("generation %d: %s" % (self.generation, gone))
                failure.in_flight = True
                raise failure

    def _failure(self, error):
        return PeerFailure("generation %d: %s" % (self.generation, str(error).splitlines()[0][:300]))

    def allreduce(self, tensor, op="sum"):
        pending = self.allreduce_async(tensor, op)
        if pending is not None:
            pending.wait()
        return tensor

    def allreduce_async(self, tensor, op="sum", commit=False):
        """Starts an all-reduce and returns a handle whose ``wait()`` finishes
        it as allreduce() does (PeerFailure on a peer's failure) and whose
        ``done()`` says whether it completed; None alone. ``commit``: on the
        commit's own group where there is one."""
        if self.world_size == 1:
            return None
        dist = _dist()
        opts = dist.AllreduceOptions()
        opts.reduceOp = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[op]
        try:
            pg = self.commit_pg if commit and self.commit_pg is not None else self._for(tensor)
            self._hold(tensor)
            return _Pending(self, pg.allreduce([tensor], opts))
        except RuntimeError as e:
            raise self._failure(e) from e

    def broadcast(self, tensor, src):
        if self.world_size == 1:
            return tensor
        dist = _dist()
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        try:
            self._hold(tensor)
            _Pending(self, self._for(tensor).broadcast([tensor], opts)).wait()
        except PeerFailure:
            raise
        except RuntimeError as e:
            raise self._failure(e) from e
        return tensor


class _Pending:
    def __init__(self, group, work):
        self.group, self.work = group, work

    def done(self):
        try:
            return self.work.is_completed()
        except RuntimeError:
            return True

    def wait(self):
        try:
            self.group._wait(self.work)
        except PeerFailure:
            raise
        except RuntimeError as e:
            raise self.group._failure(e) from e


def _as_process_group(backend, store, rank, world_size, timeout, kind):
    """``backend`` (a ProcessGroupGloo or ProcessGroupNCCL made here) as a
    ProcessGroup that DistributedDataParallel takes. On torch 1.x the
    backend is one; from torch 2.0 it is a ``Backend``, which DDP refuses,
    and is registered into a ProcessGroup as torch's own new_group does
    (torch 2.0-2.5: ProcessGroup options name the backend; 2.6 on: a
    default backend type is set)."""
    dist = _dist()
    process_group = dist.ProcessGroup
    if isinstance(backend, process_group) or not hasattr(process_group, "_register_backend"):
        return backend
    import torch
    backend_type = getattr(process_group.BackendType, kind.upper())
    if hasattr(process_group, "_set_default_backend"):
        pg = process_group(store, rank, world_size)
        pg._set_default_backend(backend_type)
    else:
        pg = process_group(store, rank, world_size,
                           process_group.Options(backend=kind, timeout=datetime.timedelta(seconds=timeout)))
    if hasattr(backend, "_set_sequence_number_for_group"):
        backend._set_sequence_number_for_group()
    devices = ["cuda"] if kind == "nccl" else ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        pg._register_backend(torch.device(device), backend_type, backend)
    return pg


def make_gloo(store, prefix, rank, world_size, timeout):
    dist = _dist()
    if world_size == 1:
        return None
    prefixed = dist.PrefixStore(prefix, store)
    backend = dist.ProcessGroupGloo(prefixed, rank, world_size, datetime.timedelta(seconds=timeout))
    return _as_process_group(backend, prefixed, rank, world_size, timeout, "gloo")


def make_device_group(backend, store, prefix, rank, world_size, timeout, at_world_one=False):
    """The in-process mode's group for the model's own collectives (DDP's
    gradients), one per generation: NCCL for a model on a GPU, or gloo
    (its plumbing, tested on CPU). None for world size 1, unless
    ``at_world_one`` (an NCCL group asked for by name: DDP then runs over it
    alone, which is what a one-GPU check of abort and re-form needs)."""
    if backend is None or (world_size == 1 and not (at_world_one and backend == "nccl")):
        return None
    if backend == "gloo":
        return make_gloo(store, prefix, rank, world_size, timeout)
    if backend != "nccl":
        raise ValueError("device_backend is 'nccl', 'gloo' or None, not %r" % (backend,))
    dist = _dist()
    if not dist.is_nccl_available():
        raise RuntimeError("device_backend='nccl': this torch was built without NCCL")
    prefixed = dist.PrefixStore(prefix, store)
    span = datetime.timedelta(seconds=timeout)
    options = getattr(dist.ProcessGroupNCCL, "Options", None)
    if options is not None:
        opts = options()
        if hasattr(opts, "_timeout"):
            opts._timeout = span
        backend = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
    else:
        backend = dist.ProcessGroupNCCL(prefixed, rank, world_size, span)
    return _as_process_group(backend, prefixed, rank, world_size, timeout, "nccl")


def _abort_method(pg):
    """The callable that aborts ``pg``'s communicators, or None: the group's
    own abort() (torch 2.6 on), its CUDA backend's abort(), or NCCL's
    _shutdown() (torch 2.0-2.5, which aborts its communicators)."""
    if pg is None:
        return None
    if hasattr(pg, "abort"):
        return pg.abort
    candidates = [pg]
    get_backend = getattr(pg, "_get_backend", None)
    if get_backend is not None:
        try:
            import torch
            candidates.append(get_backend(torch.device("cuda")))
        except Exception:  # noqa: BLE001 - no CUDA backend in this group
            pass
    for candidate in candidates:
        if hasattr(candidate, "abort"):
            return candidate.abort
        if type(candidate).__name__ == "ProcessGroupNCCL" and hasattr(candidate, "_shutdown"):
            return candidate._shutdown
    return None


def abort_group(pg):
    """Aborts a process group's communicators, so that every collective in
    flight on it (an NCCL kernel waiting for a dead peer would wait forever)
    ends with an error, from any thread. True when the group could be
    aborted: NCCL's can; gloo's cannot on torch 1.13 (its collectives fail
    when a peer's connection closes, or at their timeout)."""
    abort = _abort_method(pg)
    if abort is None:
        return False
    try:
        abort()
        return True
    except Exception as e:  # noqa: BLE001 - an abort that fails leaves the group to its timeout
        log.warning("could not abort a process group: %s", e)
        return False


def can_abort(pg):
    """Whether abort_group(pg) can end its collectives (without doing it)."""
    return _abort_method(pg) is not None


def connect_store(endpoint, timeout, is_master=False):
    dist = _dist()
    host, _, port = endpoint.rpartition(":")
    return dist.TCPStore(host or "127.0.0.1", int(port), None, is_master, timeout=datetime.timedelta(seconds=timeout),
                         wait_for_workers=False) if is_master else \
        dist.TCPStore(host or "127.0.0.1", int(port), None, False, timeout=datetime.timedelta(seconds=timeout))


def worker_id():
    return "%s-%d" % (socket.gethostname(), os.getpid())


def _peek(store, key):
    """The key's value, or None when unset, without blocking."""
    value = store.compare_set(key, "\x00", "\x00")
    return None if value == b"\x00" else value.decode()
