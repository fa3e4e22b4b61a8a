"""The store-based rendezvous of the in-process mode, where survivors and
joiners form generation g+1 of the group without any process restarting,
and the heartbeats that say who still takes part.

Store keys of the in-process rendezvous (all under the launcher's store):
  gen                 the last closed generation (a counter)
  g<N>/n              how many registered for generation N (a counter)
  g<N>/m<i>           the id of its i-th registrant
  g<N>/close          its size, set once by whoever closes it (compare_set)
  joins               bumped by every worker that asks to join a running group
  hb/<id>             a worker's heartbeat counter (bumped by a thread)
  dead/<id>           set by the launcher when it reaps a worker
  g<N>/gone           why a member of generation N is gone, set by the first
                      worker whose watch saw it (an abortable device group:
                      the others read it and abort theirs too)
  active              workers the launchers started and have not reaped (each
                      launcher adds and subtracts its own)
  finished            the last step, set by the group when the job is done: a
                      worker still trying to join (woken from a hang, or late)
                      then stops instead of waiting for a group that will not come
A generation closes when every member of the last one that is still alive
(not reaped, heartbeat still moving) has registered, or at the maximum
size, or, with at least the minimum, after ``join_timeout`` (a hung member
is left behind); a worker registered after the close joins the next one.
The first generation closes, with at least the minimum, once arrivals have
settled (``settle``) and every worker the launchers started has come, or
``join_timeout`` after the last arrival.
"""
import logging
import os
import threading
import time

from . import ElasticError, PeerFailure
from ._group import Group, JobFinished, _peek, abort_group, can_abort, connect_store, make_device_group, make_gloo, \
    worker_id
from ._generations import member_left, went_on
from ._replica_groups import ReplicaGroups
from ._sharded import replica_group
from .._text import counted
from ._store_calls import _Caller



log = logging.getLogger("stoker.elastic")


def _local_beat_file():
    """The file this worker touches for its launcher (in-process mode), or None."""
    folder = os.environ.get("STOKER_ELASTIC_BEAT_DIR")
    return os.path.join(folder, str(os.getpid())) if folder else None



class Rendezvous(ReplicaGroups):
    """The in-process mode's membership, over a store that outlives any worker
    (the launcher hosts it).

    Threads: the heartbeat thread owns its own store client. It bumps this
    worker's heartbeat and, while the main thread waits in a collective,
    checks the group's members for it, so that the main thread never makes
    a store call while it waits: on a cut-off network a store call blocks
    until the network returns, and the watch must still answer. A second
    thread touches a local file the launcher watches (not the store: a
    worker cut off from the store is alive and rejoins when the network
    returns; its launcher must not kill it)."""

    replica = None  # (group id, index, size) with replica groups (launch --replica-group-size)

    def __init__(self, endpoint, min_size, max_size, timeout=30.0, join_timeout=10.0, rendezvous_timeout=600.0,
                 heartbeat_interval=0.25, heartbeat_timeout=3.0, settle=1.0):
        self.endpoint = endpoint
        self.min_size, self.max_size = min_size, max_size
        self.timeout, self.join_timeout, self.rendezvous_timeout = timeout, join_timeout, rendezvous_timeout
        self.heartbeat_timeout, self.settle = heartbeat_timeout, settle
        self.id = worker_id()
        self.store = connect_store(endpoint, rendezvous_timeout)
        # Replica groups (launch --replica-group-size): (group id, index, size) of this worker, published
        # under rgm/<id> so that whoever closes a generation admits whole groups only.
        self.replica = replica_group()
        self._specs = {}
        if self.replica is not None:
            self.store.set("rgm/" + self.id, "%s:%d:%d" % self.replica)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.last_beat_ok = time.monotonic()  # when this worker's heartbeat last reached the store
        self.last_absence = 0.0  # when its heartbeat reached the store again after a silence the others noticed
        self._watch_request = None  # (members, generation, when asked): set by the main thread while it waits
        self._verdict = None  # (members, generation, why gone or None): the heartbeat thread's answer
        self._seen_beats = {}  # what the heartbeat thread's checks saw, published for the rendezvous
        self.joins_seen = 0
        self._joins_wanted, self._joins_read = False, None  # pending_joins(): asked for, and the last read
        # The device group (NCCL) for the model's collectives, made per generation: None, "nccl" or "gloo";
        # explicit: asked for by name (an NCCL group then forms at world size 1 too).
        self.device_backend, self.device_backend_explicit = None, False
        # (successor, generation, on_gone) while a group with an abortable device group runs: the heartbeat
        # thread watches the member after this one and the generation's "gone" mark, and calls on_gone(why)
        # once. An NCCL collective waiting for a dead peer never ends by itself: the abort ends it.
        self._armed = None
        self._fire_lock = threading.Lock()
        self.aborted_why = None  # why the armed watch aborted the device group, for the failure's message
        self._beat = threading.Thread(target=self._heartbeat, args=(heartbeat_interval,), daemon=True,
                                      name="stoker-elastic-heartbeat")
        self._beat.start()
        self._beat_file = _local_beat_file()
        self._local_beat = None
        if self._beat_file is not None:
            self._local_beat = threading.Thread(target=self._local_heartbeat, args=(heartbeat_interval,),
                                                daemon=True, name="stoker-elastic-local-heartbeat")
            self._local_beat.start()

    def _heartbeat(self, interval):
        # Its own store client, on a thread of its own that is left behind when a call hangs: after a cut
        # network the backed-off retransmissions of a request in flight can hold a connection for 10 s and
        # more, while a new connection gets through within a second or two of the network's return.
        caller = _Caller(lambda: connect_store(self.endpoint, self.rendezvous_timeout),
                         patience=self.heartbeat_timeout / 2)
        beats = {}  # member -> (heartbeat count, when it last moved), this thread's own
        armed_beats = {}
        last_check = last_armed_check = 0.0
        while True:
            self._wake.wait(interval)  # a tick, or the main thread asking for a check at once
            self._wake.clear()
            if self._stop.is_set():
                caller.end(self.endpoint, wait=2.0)
                return
            try:
                caller.run(lambda store: store.add("hb/" + self.id, 1))
                now = time.monotonic()
                if now - self.last_beat_ok > self.heartbeat_timeout:
                    self.last_absence = now  # the others may have gone on without this worker meanwhile
                self.last_beat_ok = now
                if self._joins_wanted:
                    self._joins_read = caller.run(lambda store: int(store.add("joins", 0)))
                request = self._watch_request
                now = time.monotonic()
                # Members are checked while the main thread waits, every 0.5 s at most: 2 store calls each.
                if request is not None and now - request[2] < 4 * interval + 1.0 and now - last_check >= 0.45:
                    last_check = now
                    members, generation, _ = request
                    seen = dict(beats)  # a call left behind may still write to its own copy
                    why = caller.run(lambda store: self._gone(store, members, seen) or
                                     went_on(store, generation) or
                                     member_left(store, members, generation))
                    beats = seen
                    self._seen_beats = dict(beats)
                    self._verdict = (members, generation, why)
                armed = self._armed
                if armed is not None and now - last_armed_check >= 0.45:
                    last_armed_check = now
                    seen = dict(armed_beats)
                    why, mine = caller.run(lambda store: self._armed_check(store, armed[0], armed[1], seen))
                    armed_beats = seen
                    if why is not None and self._armed is armed:
                        if mine:  # the others' watches read it at their next check (O(N) store calls a tick)
                            caller.run(lambda store: store.compare_set("g%d/gone" % armed[1], "", why))
                        self._fire(armed, why)
            except Exception:  # noqa: BLE001 - the store is unreachable: the main thread's own calls say so
                pass

    def _armed_check(self, store, successor, generation, beats):
        """(why, found here) for the armed watch: the successor gone, another
        member's watch having marked the generation, or the group gone on;
        nothing once the job has finished (a member that finished first
        leaves, and the others need no collective after their last commit).
        At most 4 store calls, 5 when something is found."""
        why = self._gone(store, [successor], beats) if successor is not None else None
        mine = why is not None
        if why is None:
            why = _peek(store, "g%d/gone" % generation) or went_on(store, generation)
        if why is not None and _peek(store, "finished") is not None:
            return None, False
        return why, mine

    def arm(self, successor, generation, on_gone):
        """Watches ``successor`` (the member after this worker; None alone)
        and generation ``generation``'s "gone" mark from the heartbeat
        thread, every 0.5 s, and calls ``on_gone(why)`` there once when
        either says a member is gone."""
        self._armed = (successor, generation, on_gone)
        self.aborted_why = None

    def disarm(self):
        self._armed = None
        self.aborted_why = None

    def _fire(self, armed, why):
        with self._fire_lock:  # the heartbeat thread and fire_armed() may both find it armed
            if self._armed is not armed:
                return
            self._armed = None
            self.aborted_why = why
        try:
            armed[2](why)
        except Exception as e:  # noqa: BLE001 - never on the heartbeat thread's account
            log.warning("aborting the device group failed: %s", e)

    def fire_armed(self, why):
        """Calls the armed watch's on_gone now (the tests' fault injection)."""
        armed = self._armed
        if armed is not None:
            self._fire(armed, why)

    def _local_heartbeat(self, interval):
        while not self._stop.wait(interval):
            try:
                os.utime(self._beat_file)
            except FileNotFoundError:
                try:
                    with open(self._beat_file, "a"):
                        pass
                except OSError:
                    return  # the launcher's folder is gone: it is not watching
            except OSError:
                return

    def watch(self, members, generation):
        """The group's watch: why one of ``members`` no longer takes part in
        ``generation``, or None; it never blocks. ``check(False)`` looks
        only at this worker's own heartbeat (a short wait). The answer comes from the
        heartbeat thread's last check (asked for here; a member whose
        heartbeat stopped is found within heartbeat_timeout plus a poll),
        or says that this worker itself is cut off: its own heartbeat has
        not reached the store for heartbeat_timeout, so the others are
        going on without it."""
        members = tuple(members)

        def check(members_too=True):
            now = time.monotonic()
            if now - self.last_beat_ok > self.heartbeat_timeout:
                return ("this worker's heartbeat has not reached the store for %.1f s (cut off from the job?); the "
                        "others go on without it" % (now - self.last_beat_ok))
            if not members_too:
                return None
            asked, self._watch_request = self._watch_request, (members, generation, now)
            if asked is None or now - asked[2] > 1.0:
                self._wake.set()  # a new wait: the first check at once, not at the next tick
            verdict = self._verdict
            if verdict is not None and verdict[0] == members and verdict[1] == generation:
                return verdict[2]
            return None
        return check

    def away_since(self, since):
        """Why this worker may have been left behind since ``since`` (a
        monotonic time): its heartbeat was silent long enough for the others
        to go on without it (it was stopped, starved or cut off), or is now.
        No store call. A commit checks this after its collective: a worker
        that was away may complete a collective the others abandoned, and
        must not commit it."""
        now = time.monotonic()
        if now - self.last_beat_ok > self.heartbeat_timeout:
            return "this worker's heartbeat has not reached the store for %.1f s" % (now - self.last_beat_ok)
        if self.last_absence > since:
            return "this worker's heartbeat was silent for more than %.0f s during the step (stopped or cut off)" % (
                self.heartbeat_timeout)
        return None

    def probe(self, members):
        """Why one of ``members`` is gone, asked of the store now (it blocks
        while the store is unreachable, unless this worker already knows it
        is cut off)."""
        now = time.monotonic()
        if now - self.last_beat_ok > self.heartbeat_timeout:
            return "this worker's heartbeat has not reached the store for %.1f s" % (now - self.last_beat_ok)
        return self._gone(self.store, members, dict(self._seen_beats))

    def close(self):
        """Stops the heartbeats; the launcher then no longer watches this
        worker (the program may go on with other work for as long as it
        likes)."""
        self._stop.set()
        self._wake.set()
        self._beat.join(timeout=5.0)  # it ends its calls left behind (see _Caller.end)
        if self._local_beat is not None:
            self._local_beat.join(timeout=5.0)  # not touching the file again once it is removed
            try:
                os.unlink(self._beat_file)
            except OSError:
                pass

    def finish(self, step):
        """Tells workers still trying to join that the job is over."""
        self.store.set("finished", str(step))

    def pending_joins(self):
        """How many workers have asked to join so far, as the heartbeat
        thread last read it (at most a heartbeat old): rank 0 asks every
        step, and a store call of its own would block the step while the
        store is unreachable."""
        self._joins_wanted = True
        joins = self._joins_read
        return self.joins_seen if joins is None else max(joins, self.joins_seen)

    def request_join(self):
        self.store.add("joins", 1)

    def members(self, generation):
        closed = _peek(self.store, "g%d/close" % generation)
        if closed is None:
            return []
        members = [self.store.get("g%d/m%d" % (generation, i)).decode() for i in range(int(closed.split(":", 1)[0]))]
        return self._admitted(members) if self.replica is not None else members

    def next_group(self, previous=None, previous_generation=0):
        """Registers for the next generation and returns (Group, members) once
        it closes with this worker in it; raises ElasticError when fewer than
        the minimum come within rendezvous_timeout. ``previous``: the members
        of generation ``previous_generation``, this worker's last group."""
        start = time.monotonic()
        self._wait_for_own_heartbeat(start)
        was_member = previous is not None
        while True:
            current = int(self.store.add("gen", 0))
            if previous is not None and current != previous_generation:
                # The others went on without this worker (it hung, or was slow): join as a newcomer.
                log.warning("generation %d went on without this worker (its last was %d); joining again", current,
                            previous_generation)
                previous = None
                self.request_join()
            generation = current + 1
            index = int(self.store.add("g%d/n" % generation, 1)) - 1
            self.store.set("g%d/m%d" % (generation, index), self.id)
            size = self._wait_close(generation, previous, start, current)
            if index < size:
                members = [self.store.get("g%d/m%d" % (generation, i)).decode() for i in range(size)]
                if self.replica is not None:
                    members = self._admitted_or_leave(members, generation, was_member)
                    if members is None:  # its group was not whole yet: the next generation
                        previous = None
                        self.request_join()
                        continue
                    index, size = members.index(self.id), len(members)
                self.joins_seen = int(self.store.add("joins", 0))
                try:
                    pg = make_gloo(self.store, "pg%d" % generation, index, size, self.timeout)
                    commit_pg = make_gloo(self.store, "pg%d-commit" % generation, index, size, self.timeout)
                    device_pg = make_device_group(self.device_backend, self.store, "pg%d-device" % generation, index,
                                                  size, self.timeout, at_world_one=self.device_backend_explicit)
                except RuntimeError as e:  # a member died while the group connected
                    raise PeerFailure("generation %d could not connect: %s" % (generation, e)) from e
                log.info("generation %d: rank %d of %d%s", generation, index, size,
                         " (device group: %s)" % self.device_backend if device_pg is not None else "")
                others = [m for m in members if m != self.id]
                group = Group(pg, index, size, generation, watch=self.watch(others, generation),
                              probe=lambda: self.probe(others), commit_pg=commit_pg, device_pg=device_pg,
                              owns_device_pg=device_pg is not None)
                if self.replica is not None:
                    group.replica = self._replica_dimension(members, generation, others)
                # Device groups (NCCL) to abort when a member is found gone: the generation's, and with replica
                # groups the one of this worker's shard.
                abortable = [p for p in (device_pg, group.replica.device_pg if group.replica else None)
                             if can_abort(p)]
                if abortable:
                    successor = members[(index + 1) % size] if size > 1 else None

                    def on_gone(why, pgs=tuple(abortable), generation=generation):
                        log.warning("generation %d: %s; aborting the device group", generation, why)
                        for device_group in pgs:
                            abort_group(device_group)
                    self.arm(successor, generation, on_gone)
                return group, members
            log.info("generation %d closed with %s before this one registered; joining the next", generation,
                     counted(size, "worker", "workers"))
            previous = None
            self.request_join()

    def _wait_for_own_heartbeat(self, start):
        """Waits until this worker's heartbeat reaches the store again. After
        a cut network, the heartbeat thread's connection can take seconds
        longer to recover (TCP's retransmissions back off) than the main
        thread's, which had nothing in flight: a worker that registered then
        would be found silent by the group it joins, and cast out again."""
        logged = False
        while time.monotonic() - self.last_beat_ok > self.heartbeat_timeout / 2:
            if not logged:
                log.info("waiting for this worker's heartbeat to reach the store before joining a group")
                logged = True
            if time.monotonic() - start > self.rendezvous_timeout:
                raise ElasticError("this worker's heartbeat did not reach the store at %s within %.0f s "
                                   "(rendezvous_timeout)" % (self.endpoint, self.rendezvous_timeout))
            time.sleep(0.05)

    def _gone(self, store, members, beats):
        """Why one of ``members`` no longer takes part (reaped by its launcher,
        or its heartbeat silent past heartbeat_timeout), or None. 2 store
        calls a member, on ``store`` (the calling thread's client)."""
        now = time.monotonic()
        for m in members:
            if _peek(store, "dead/" + m) is not None:
                return "%s died (its launcher reaped it)" % m
            if not self._alive(store, m, beats, now):
                return "%s stopped answering (no heartbeat for %.1f s: hung, stopped or cut off)" % (
                    m, now - beats[m][1])
        return None

    def _alive(self, store, member, beats, now):
        """Whether `member` still runs: not reaped by its launcher, and its heartbeat moved lately."""
        if _peek(store, "dead/" + member) is not None:
            return False
        value = int(store.add("hb/" + member, 0))
        seen = beats.get(member)
        if seen is None or seen[0] != value:
            beats[member] = (value, now)
            return True
        return now - seen[1] <= self.heartbeat_timeout

    def _wait_close(self, generation, previous, start, current):
        expected_old = [m for m in (previous or []) if m != self.id]
        # Who may close: members of the last generation, or anyone at the very first meeting, or a newcomer
        # once every member of the last generation is gone. Otherwise a newcomer could close a group of its
        # own beside the running one.
        running = self.members(current) if previous is None and current > 0 else []
        beats = dict(self._seen_beats)  # what the group's watch already saw: a member it found silent stays so
        last_count, last_change = -1, time.monotonic()
        opened = time.monotonic()
        # Store traffic: 3 calls a poll, each registrant's id read once, and a missing member's liveness
        # (2 calls) at most every heartbeat interval: O(N) per worker while a generation forms (was every
        # registrant and member every 20 ms, O(N^2)).
        registered, known = set(), 0
        checked = {}  # member -> (alive, when checked)

        def alive(member, now):
            seen = checked.get(member)
            if seen is None or now - seen[1] >= 0.25:
                seen = checked[member] = (self._alive(self.store, member, beats, now), now)
            return seen[0]
        while True:
            closed = _peek(self.store, "g%d/close" % generation)
            if closed is not None:
                return int(closed.split(":", 1)[0])
            finished = _peek(self.store, "finished")
            if finished is not None:
                raise JobFinished("the job finished at step %s without this worker" % finished)
            now = time.monotonic()
            count = int(self.store.add("g%d/n" % generation, 0))
            if count != last_count:
                last_count, last_change = count, now
            while known < count:
                who = _peek(self.store, "g%d/m%d" % (generation, known))
                if who is None:
                    break  # counted but its id not written yet: read it at the next poll
                registered.add(who)
                known += 1
            waiting_for = [m for m in expected_old if m not in registered and alive(m, now)]
            if self.replica is not None and waiting_for:
                # A member whose replica group lost a worker will not come (it leaves when it learns of it).
                broken = {self._spec(self.store, m)[0] for m in expected_old if not alive(m, now)}
                waiting_for = [m for m in waiting_for if self._spec(self.store, m)[0] not in broken]
            ready = False
            if running and any(m not in registered and alive(m, now) for m in running):
                pass  # a newcomer: the running group's members close this generation when they come
            elif count >= self.max_size:
                ready = True
            elif count >= self.min_size:
                if previous is not None:
                    ready = not waiting_for or now - opened > self.join_timeout
                    if ready and waiting_for:
                        log.warning("generation %d closes without %s: no answer within %.0f s (hung?)", generation,
                                    ", ".join(waiting_for), self.join_timeout)
                elif now - last_change >= self.settle:
                    # A first meeting: arrivals settled, and every worker the launchers started (the store's
                    # "active") is here; one still starting (importing torch on a loaded node takes seconds)
                    # is waited for up to join_timeout after the last arrival, not left for the next
                    # generation.
                    started = min(int(self.store.add("active", 0)), self.max_size)
                    ready = count >= started or now - last_change > self.join_timeout
                    if ready and count < started:
                        log.warning("generation %d starts with %d of the %d workers the launchers started: the "
                                    "others did not come within %.0f s", generation, count, started,
                                    self.join_timeout)
            if ready and self.replica is not None:
                incomplete = self._groups_to_wait_for(self.store, [m for m in registered], expected_old,
                                                      alive, now)
                if incomplete and now - opened <= self.join_timeout:
                    ready = False  # a replica group still coming: close with it whole
                elif incomplete:
                    log.warning("generation %d closes without replica groups %s: not whole within %.0f s",
                                generation, ", ".join(incomplete), self.join_timeout)
            if ready:
                mine = "%d:%s" % (count, self.id)
                winner = self.store.compare_set("g%d/close" % generation, "", mine).decode()
                if winner == mine:
                    self.store.add("gen", 1)  # publish: later registrants go to the next generation
                return int(winner.split(":", 1)[0])
            if now - start > self.rendezvous_timeout:
                raise ElasticError("only %d of the minimum %d workers came to generation %d within %.0f s "
                                   "(rendezvous_timeout); registered: %s" % (count, self.min_size, generation,
                                                                           self.rendezvous_timeout,
                                                                           ", ".join(sorted(registered)) or "none"))
            time.sleep(0.02)
