"""The runner's membership: forming a group (torchrun's, or the in-process
rendezvous' generations), agreeing on the newest committed step and handing
its state to whoever is behind or new, re-forming after a failure or a join,
and the start and end of a run. Mixed into _Runner, whose attributes it
uses."""
import contextlib
import ctypes
import io
import logging
import os
import signal
import threading
import time

from . import ElasticError, PeerFailure
from ._group import Group, abort_group
from .._text import counted
from ._rendezvous import Rendezvous
from ._sharded import stop_replica_groups

log = logging.getLogger("stoker.elastic")


def _torch():
    import torch
    return torch


class Membership:
    def _form_group(self):
        if self.mode == "single":
            self.group = Group(None, 0, 1, 0)
        elif self.mode == "torchrun":
            # torch's own env:// initialisation knows how each version shares the store between rounds.
            import datetime
            import torch.distributed as dist
            span = datetime.timedelta(seconds=self.timeout)
            if not dist.is_initialized():
                # The round's workers start at their own pace (importing torch 2 alone takes seconds, more on a
                # busy host): forming waits longer than a collective. A peer that dies meanwhile makes its
                # agent restart the round, which ends this wait sooner.
                forming = min(self.rendezvous_timeout, max(self.timeout, 60.0))
                _warn_if_store_shared()
                try:
                    with _sigterm_ends_at_once():  # the agent ending the round must not wait for this wait
                        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=forming))
                except RuntimeError as e:
                    raise PeerFailure("could not form the group of this round: %s" % e) from e
            default_pg, device_pg = dist.distributed_c10d._get_default_group(), None
            if dist.get_backend(default_pg) != "gloo":
                # The program's own group (NCCL) takes CUDA tensors only: the runner's host tensors (sample
                # ids, agreement, the state's bytes) go through a gloo group beside it, the gradients through
                # the program's group.
                device_pg = default_pg
            commit_pg = None
            try:
                # The runner's own groups, with the collective timeout (the default group has the forming one).
                pg = dist.new_group(backend="gloo", timeout=span)
                if dist.get_world_size() > 1:
                    commit_pg = dist.new_group(backend="gloo", timeout=span)
            except RuntimeError as e:
                raise PeerFailure("could not form the runner's groups of this round: %s" % e) from e
            self.group = Group(pg, dist.get_rank(), dist.get_world_size(),
                               int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")), device_pg=device_pg,
                               commit_pg=commit_pg)
        else:
            if self.rendezvous is None:
                lo, hi = os.environ.get("STOKER_ELASTIC_NNODES_WORKERS", "1:1").split(":")
                self.rendezvous = Rendezvous(os.environ["STOKER_ELASTIC_STORE"], int(lo), int(hi),
                                             timeout=self.timeout, join_timeout=self.join_timeout,
                                             rendezvous_timeout=self.rendezvous_timeout)
                if int(self.rendezvous.store.add("gen", 0)) > 0:
                    self.rendezvous.request_join()  # a group is running: ask it to make room
            previous_generation = self.group.generation if self.group is not None else 0
            self.rendezvous.device_backend, self.rendezvous.device_backend_explicit = self._device_backend()
            self.group, self.members = self.rendezvous.next_group(self.members or None, previous_generation)
        self.summary.world_sizes.append(self.group.world_size)

    def _device_backend(self):
        """(backend, asked by name) of the in-process mode's device group:
        ``device_backend=`` (or STOKER_ELASTIC_DEVICE_BACKEND) "nccl", "gloo"
        or "none"; by default NCCL for a model on a GPU where torch has it,
        none otherwise (the gloo group then takes the model's collectives)."""
        choice = os.environ.get("STOKER_ELASTIC_DEVICE_BACKEND") or getattr(self, "device_backend", None)
        if choice in (None, "", "auto"):
            import torch.distributed as dist
            on_gpu = self._device().type == "cuda"
            return ("nccl" if on_gpu and dist.is_nccl_available() else None), False
        if choice == "none":
            return None, False
        if choice not in ("nccl", "gloo"):
            raise ElasticError("device_backend is 'nccl', 'gloo', 'none' or 'auto', not %r" % (choice,))
        return choice, True

    def _agree_and_sync(self):
        """Agree on the newest state among the group and give it to everyone.
        Every decision here comes from a reduction, so all ranks take the
        same branch."""
        if self.sharded:
            return self._agree_and_sync_sharded()
        torch = _torch()
        g = self.group
        _test_fault(g.generation)

        def reduce(value, op):
            return int(g.allreduce(torch.tensor([value], dtype=torch.int64), op)[0])

        saved = self._newest_saved_step() if self.step < 0 else None
        have = max(self.step, -1 if saved is None else saved)
        hi = reduce(have, "max")
        src = reduce(g.rank if have == hi else 1 << 30, "min")
        if g.rank == src and self.step < hi:
            self._load_saved()  # the newest state is on this rank's storage (an older one if that is corrupt)
        src_step = reduce(self.step if g.rank == src else -2, "max")
        behind = reduce(int(self.step != src_step), "max")
        if g.world_size > 1 and (behind or src_step < 0):
            # Someone is behind or new, or everyone starts fresh (random inits differ): send the source's state.
            self._broadcast_state(g, src)
        if self.rendezvous is not None:
            self.rendezvous.joins_seen = reduce(self.rendezvous.joins_seen, "max")
        self._reshard()
        if self.committed_position is not None:
            # Back to just after the agreed step: the batch taken for the step in flight is taken again.
            self.loader.load_state_dict(self.committed_position)
        if g.rank == 0 and self.last_commit is not None and self.on_commit is not None and \
                not self.on_commit_all_ranks:
            # The old rank 0 may have died before reporting the last committed step: report it again
            # (when every rank reports its own commits, none is missing).
            info = dict(self.last_commit)
            info["replayed"] = True
            self.on_commit(info)

    def _broadcast_state(self, g, src):
        """Sends rank ``src``'s state to every other rank of ``g``, which applies it."""
        data = broadcast_bytes(g, self._serialize() if g.rank == src else None, src)
        if g.rank != src:
            # Onto this rank's own device: the source's tensors may be on another GPU.
            received = load_from_peer(data, map_location=self._device())
            self._apply(received["state"], received["loader"], received["meta"])

    def _reconfigure(self, why, in_flight=False):
        start = time.monotonic()
        if self.in_flight:
            self.summary.recomputed_steps += 1
            self.in_flight = False
        log.warning("rank %d of %d (generation %d): %s; re-forming the group", self.group.rank, self.group.world_size,
                    self.group.generation, why)
        # Close this rank's connections of the broken group now: a peer blocked on data this rank will never
        # send then fails at once instead of after the collective timeout (in a ring of 4 or more, the dead
        # rank's neighbours see the failure first, the others only through them). Unless a collective was
        # left in flight (a hung peer noticed by its heartbeat): destroying that group would wait for gloo's
        # timeout, so it is kept until then.
        now = time.monotonic()
        self.graveyard = [(t, pg) for t, pg in self.graveyard if now - t < self.timeout + 5.0]
        if self.rendezvous is not None:
            self.rendezvous.disarm()
        if in_flight:
            self.graveyard.append((now, self.group.pg))
            self.graveyard.append((now, self.group.commit_pg))
            if self.group.replica is not None:
                self.graveyard.append((now, self.group.replica.pg))
                if getattr(self.group.replica, "siblings", None) is not None:
                    self.graveyard.append((now, self.group.replica.siblings.pg))
        for owner in (self.group, self.group.replica):
            if owner is not None and owner.owns_device_pg and owner.device_pg is not None:
                # NCCL's communicators are aborted (a kernel waiting for the dead peer ends); a gloo device group
                # cannot be, and goes the way of the others.
                if not abort_group(owner.device_pg) and in_flight:
                    self.graveyard.append((now, owner.device_pg))
                owner.device_pg = None
        self.group.close()
        self.summary.reconfigurations += 1
        deadline = start + self.rendezvous_timeout
        while True:
            try:
                self._form_group()
                self._agree_and_sync()
                break
            except PeerFailure as e:  # a failure during the reconfiguration itself: try the next generation
                if time.monotonic() > deadline:
                    raise ElasticError("could not re-form the group within %.0f s: %s" % (self.rendezvous_timeout,
                                                                                          e)) from e
                log.warning("reconfiguration failed (%s); trying again", e)
        self.summary.recovery_seconds.append(time.monotonic() - start)
        log.info("training goes on at step %d with %s (%.2f s to recover)", self.step + 1,
                 counted(self.group.world_size, "worker", "workers"), time.monotonic() - start)

    def _begin(self):
        """Forms the first group and agrees on where to start (a restored
        state, or the source's); run() and Trainer start here."""
        self._ensure_loader(0)
        self.committed_position = self.loader.state_dict()  # nothing committed yet: the start
        try:
            self._form_group()
            self._agree_and_sync()
        except PeerFailure as e:
            self._on_failure(e)
        if self.step >= 0:
            self.summary.restored_step = self.step

    def _done(self):
        """The epochs are trained: workers still trying to join are told to stop."""
        if self.rendezvous is not None:
            self.rendezvous.disarm()
            self.rendezvous.finish(self.step)

    def _refuse_commit_if_away(self, since):
        """Raises PeerFailure (a collective in flight) when this worker was
        away since ``since`` (its batch was taken): its commit's collective
        may have completed against halves the others left behind when they
        went on without it, so it must not commit."""
        away = self.rendezvous.away_since(since) if self.rendezvous is not None else None
        if away is not None:
            failure = PeerFailure("generation %d: %s; the others may have gone on without it, so it does not "
                                  "commit step %d" % (self.group.generation, away, self.step + 1))
            failure.in_flight = True
            raise failure

    def _release_groups(self):
        """At the end of the run: a group left with a collective in flight
        (a peer cut off or hung, whose connections never closed) would make
        its destructor, and so the program's exit, wait for gloo's timeout.
        Such a group is never destroyed: the process ends with it."""
        now = time.monotonic()
        for when, pg in self.graveyard:
            if pg is not None and now - when < self.timeout + 5.0:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(pg))  # a reference never given back
        self.graveyard = []
        if self.group is not None and self.mode == "in_process":
            self.group.close()  # now, in a safe order, rather than wherever the interpreter's exit drops it

    def _stop_replica_groups(self, error):
        """After an ElasticError that ends this worker (no live worker holds
        the committed steps, a shard missing), in run() and the Trainer
        alike: the launchers start no replica group again, as it would meet
        the same end."""
        if self.sharded:
            stop_replica_groups(str(error))

    def _left_behind(self, error):
        log.warning("%s; nothing left to do", error)
        self.summary.left_behind = True

    def _on_failure(self, error):
        if self.mode != "in_process":
            log.error("rank %s: %s; exiting so that the launcher restarts the group from the last snapshot "
                      "(step %d)", self.group.rank if self.group else "?", error, self.step)
            raise SystemExit(1)
        self._reconfigure(str(error), getattr(error, "in_flight", False))


def broadcast_bytes(g, payload, src):
    """``payload`` (bytes on rank ``src``, ignored elsewhere) from rank
    ``src`` to every rank of ``g``; returns it on every rank."""
    torch = _torch()
    size = g.broadcast(torch.tensor([len(payload) if g.rank == src else 0], dtype=torch.int64), src)
    if int(size[0]) == 0:
        return b""
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if g.rank == src else \
        torch.empty(int(size[0]), dtype=torch.uint8)
    g.broadcast(data, src)
    return payload if g.rank == src else data.numpy().tobytes()


def load_from_peer(data, map_location=None):
    """torch.load of bytes a peer of this job sent. A pickle (torch 1.13's
    weights_only loader rejects plain floats): the group's store and network
    are the job's own, as for torch's own collectives."""
    torch = _torch()
    kwargs = {"weights_only": False} if "weights_only" in torch.load.__code__.co_varnames else {}
    return torch.load(io.BytesIO(data), map_location=map_location, **kwargs)


@contextlib.contextmanager
def _sigterm_ends_at_once():
    """While forming, SIGTERM ends the process at once: Python's handler
    would run only after the C++ wait returns, and a new process has no
    snapshot to finish writing yet."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _warn_if_store_shared():
    """Under plain torchrun 2.4 or later (stoker.elastic.launch fixes it):
    see _torchrun_compat.shares_rendezvous_store."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    torch = _torch()
    from ._torchrun_compat import shares_rendezvous_store
    if shares_rendezvous_store(torch.__version__):
        log.warning("torch %s's torchrun shares its rendezvous store with the workers across rounds, so after a "
                    "failure the workers of a restarted round can read the last round's addresses and fail to "
                    "meet (pytorch/pytorch#135712 on 2.4-2.5; one store server for every round since): launch "
                    "with stoker.elastic.launch or set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun",
                    torch.__version__)


def _test_stall(step):
    """Fault injection for the tests: this worker stops itself (SIGSTOP; the
    test sends SIGCONT) between a step's gradient all-reduce and its commit."""
    spec = os.environ.get("STOKER_ELASTIC_TEST_STOP_BEFORE_COMMIT")
    if spec and int(spec) == step and os.environ.get("LOCAL_RANK") == os.environ.get(
            "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK", "0"):
        import signal
        log.warning("test fault: stopping before the commit of step %d", step)
        os.kill(os.getpid(), signal.SIGSTOP)


def _test_lost_commit(step):
    """Fault injection for the tests: this worker behaves as if the commit's
    collective of ``step`` failed here after completing on the others."""
    spec = os.environ.get("STOKER_ELASTIC_TEST_LOSE_COMMIT")
    if spec and int(spec) == step and os.environ.get("LOCAL_RANK") == os.environ.get(
            "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK", "0"):
        raise PeerFailure("test fault: the commit's collective of step %d failed on this worker alone" % step)


def _test_fault(generation):
    """Fault injection for the tests: this worker dies as generation `generation` syncs its state."""
    spec = os.environ.get("STOKER_ELASTIC_TEST_DIE_AT_GENERATION")
    if spec and int(spec) == generation and os.environ.get("LOCAL_RANK") == os.environ.get(
            "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK", "0"):
        log.warning("test fault: dying while generation %d syncs", generation)
        os._exit(3)
