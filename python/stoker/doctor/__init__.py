"""The doctor: where each training step's time goes, and what to change.

Wrap the training loop's batches and its stalls, and the doctor splits every
step's wall time into categories that add up to it::

    with stoker.doctor.Doctor() as doc:
        for images, labels in doc.batches(loader):          # time in next(): data wait
            loss = model(images.cuda()).loss                # the step's own work
            loss.backward(); opt.step()
            if step % 100 == 0:
                with doc.phase("checkpoint"):               # a synchronous save
                    torch.save(model.state_dict(), path)
    print(doc.report())

A step runs from the moment the loop asks for a batch to the moment it asks
for the next. Its wall time is split into categories (``CATEGORIES``) that
add up to it, from the GPU's side: ``compute`` is time the GPU was busy; the
rest is GPU idle time by cause. Stalls are the host's spans: ``data_wait``
(inside the loader's ``next()``), and ``h2d_copy``, ``checkpoint``,
``sync``, ``communication`` (``phase(...)`` blocks, or the copy that
``batches(..., device=)`` makes). A CUDA event recorded as each stall
begins tells when the GPU ran out of queued work: the GPU computed until
then (a data wait hidden behind queued work costs nothing) and idled, on
that stall, from then to its end. ``launch`` is idle time inside the
step's own code (the host did not queue work fast enough), which events
cannot see: NVML's utilisation, where present, estimates it. Without a GPU
every stall counts as idle throughout. ``report()`` also gives the host's
view: how long the training thread was blocked in each stall. Host clocks,
CUDA events and NVML only: no profiler, no root.

A step is an optimizer step once the doctor sees one (``optimizer_step()``;
``stoker doctor`` hooks every torch optimizer): the micro-batches of
gradient accumulation make one step. Batches fetched without gradients
(``torch.no_grad()``, ``inference_mode()``: evaluation) and the first
``warmup_steps`` steps are timed but not counted. The doctor never raises
into the loop for trouble of its own: it says once on stderr what failed and
stops accounting; ``phase()`` blocks on threads other than the one that
iterates the batches, or inside another phase, count nothing.

Outputs: ``report()`` (the account and a verdict with a fix and a predicted
gain), ``prometheus_text()`` (the text exposition format; ``serve(port)``
exposes it), ``chrome_trace()`` (Trace Event JSON of the last steps and of
slow ones, bounded).
"""
import collections
import contextlib
import sys
import threading
import time

from . import _advice, _export, _gpu
from ._export import BUCKETS
from ._steps import _CommMarks, _Step, to_device
from ._timeline import CATEGORIES, STALLS, attribute

_EVALUATION = object()  # what _begin_batch returns for a batch of an evaluation loop

# The stalls a phase() block marks (data wait is marked by the batches themselves).
PHASES = tuple(s for s in STALLS if s != "data_wait")


class Doctor:
    """Accounts for every step of a training loop (see the module's help).

    ``cuda``: time the GPU with CUDA events on torch's current stream
    (default: when torch sees a GPU). ``nvml``: sample NVML's utilisation and
    memory of the process's own device (CUDA_VISIBLE_DEVICES respected;
    default: when NVML loads). ``warmup_steps``: steps timed but not counted
    at the start (compilation, autotuning, allocator growth).
    ``trace_steps``: steps kept in full for ``chrome_trace()`` (the last
    ones), plus up to as many slow ones (over ``slow_factor`` times the
    median). Seams for tests: ``clock`` (seconds), ``gpu``
    (record/done/wait/time, as _gpu.TorchGpuTimer), ``busy_fraction``
    ((t0, t1) -> share of the time the GPU computed)."""

    def __init__(self, cuda=None, nvml=None, trace_steps=64, slow_factor=3.0, clock=time.perf_counter, gpu=None,
                 busy_fraction=None, mtbf_hours=24.0, warmup_steps=5):
        self._clock = clock
        self.cannot_see = []
        self._gpu = gpu
        self._torch = None
        if self._gpu is None and (cuda is None or cuda):
            try:
                import torch
                if torch.cuda.is_available():
                    self._torch = torch
                    self._gpu = _gpu.TorchGpuTimer(torch, clock)
            except ImportError:
                pass
            if cuda and self._gpu is None:
                raise RuntimeError("Doctor(cuda=True): torch sees no CUDA device")
        if self._gpu is None:
            self.cannot_see.append("GPU timing (no CUDA device): a stall counts as idle throughout, and compute is "
                                   "the host's time in the step")
        self._busy_fraction = busy_fraction
        self.warmup_steps = max(0, int(warmup_steps))
        self._nvml = None
        self._nvml_device = None
        if nvml is None or nvml:
            self._nvml_device = _gpu.visible_device(self._torch.cuda.current_device() if self._torch else 0,
                                                    self._torch)
            handle, why = _gpu.open_nvml(self._nvml_device)
            if handle is not None:
                self._nvml = _gpu.NvmlSampler(handle)
                self._nvml.counting = self.warmup_steps == 0
            elif nvml:
                raise RuntimeError("Doctor(nvml=True): " + why)
            elif self._gpu is not None and busy_fraction is None:
                self.cannot_see.append(why + "; launch gaps inside a step count as compute")
        elif self._gpu is not None and busy_fraction is None:
            self.cannot_see.append("NVML (not used: nvml=False): launch gaps inside a step count as compute")
        self.totals = dict.fromkeys(CATEGORIES, 0.0)
        self.host_totals = dict.fromkeys(STALLS, 0.0)
        self.stall_counts = dict.fromkeys(STALLS, 0)
        self._mtbf_s = mtbf_hours * 3600.0
        self.steps = 0
        self.wall = 0.0
        self._micro_batches = 0
        self._warmup = {"steps": 0, "wall_s": 0.0}
        self._evaluation = {"batches": 0, "wall_s": 0.0}
        self._durations = collections.deque(maxlen=512)  # recent step durations, for the median
        self._median = None
        self._histogram = [0] * (len(BUCKETS) + 1)
        self._recent = collections.deque(maxlen=trace_steps)
        self._slow = collections.deque(maxlen=trace_steps)
        self._slow_factor = slow_factor
        # The step machinery: touched by the loop's thread, and by close() and hooks from any thread.
        self._step_lock = threading.RLock()
        self._pending = collections.deque()  # ended steps whose GPU events are not all done
        self._current = None
        self._loop_thread = None  # the thread that iterates the batches: only its phases count
        self._phase_depth = 0
        self._started = 0  # training steps started (warm-up ends when it reaches warmup_steps)
        self._settled = 0  # steps settled, boundaries excepted
        self._eval_since = None
        self._optimizer_mode = False
        self._comm = _CommMarks()
        self._loader = None
        self._pageable_copies = 0
        self._copies = 0
        self._lock = threading.Lock()  # the totals: read by the metrics endpoint's thread
        self._what_if = None
        self._closed = False
        self._failed = None
        self._server = None
        self._origin = clock()

    # -- the loop ----------------------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends the step in progress (its time counts), settles every step and
        stops the NVML sampler and the endpoint. Closing twice is harmless;
        so is closing from another thread while the loop runs."""
        with self._step_lock:
            if self._closed:
                return
            self._closed = True
            try:
                now = self._clock()
                if self._current is not None:
                    self._end_step(now)
                if self._eval_since is not None:
                    self._end_evaluation(now)
                self._settle_ready(wait=True)
            except Exception as e:  # noqa: BLE001 - closing never raises for the doctor's own trouble
                self._fail("close", e)
        if self._nvml is not None:
            self._nvml.stop()
            if self._nvml.error:
                self.cannot_see.append("NVML stopped answering: " + self._nvml.error)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def batches(self, iterable, device=None, training=None, loader=None):
        """Yields ``iterable``'s batches, each step starting when the next batch
        is asked for; the time inside ``next()`` is data wait. With
        ``device``, tensors of each batch are moved there (non-blocking) and
        the time is counted as ``h2d_copy``; pageable sources are noted.
        ``training``: False for an evaluation loop (timed, not counted as
        steps); None decides per batch (no gradients: evaluation).
        ``loader``: the stoker.Loader or TokenLoader behind ``iterable`` (whose stats the
        advice reads), when ``iterable`` is not the loader itself."""
        if loader is None and hasattr(iterable, "stats") and hasattr(iterable, "summary"):
            loader = iterable
        if loader is not None:
            self._loader = loader
        it = iter(iterable)
        while True:
            try:
                batch = self.next_batch(lambda: next(it), training=training)
            except StopIteration:
                return  # the wait that found the end of the data is kept: it is the epoch boundary's
            if device is not None:
                with self.phase("h2d_copy"):
                    batch = to_device(batch, device, self._count_copy)
            yield batch

    def next_batch(self, fetch, training=None):
        """Ends the current step, starts the next and returns ``fetch()``, its
        time counted as data wait (what ``batches`` does for each batch; for
        hooking iterators directly). Exceptions from ``fetch`` pass through;
        the doctor's own never do."""
        if self._failed is not None or self._closed:
            return fetch()
        try:
            opened = self._begin_batch(training)
        except Exception as e:  # noqa: BLE001
            self._fail("next_batch", e)
            return fetch()
        try:
            return fetch()
        except StopIteration:
            if opened is _EVALUATION:
                with self._lock:
                    self._evaluation["batches"] -= 1  # the end of the data is no batch
            elif opened is not None:
                opened[0].boundary = True
            raise
        finally:
            if opened is not None and opened is not _EVALUATION:
                opened[1][2] = self._clock()

    def optimizer_step(self):
        """Marks an optimizer step in the current step. From the first one on,
        a step ends only at the batch after an optimizer step: the
        micro-batches of gradient accumulation are one step. ``stoker
        doctor`` calls it from every torch optimizer's ``step``."""
        if threading.get_ident() != self._loop_thread:
            return
        step = self._current
        if step is not None:
            step.optimizer_steps += 1
        self._optimizer_mode = True

    @contextlib.contextmanager
    def phase(self, category):
        """Counts the block as a stall of ``category`` (one of PHASES) in the
        current step: the GPU's idle time during it is that category's. A
        phase inside another belongs to the outer one; one on another
        thread than the loop's, or outside a step, counts nothing."""
        if category not in PHASES:
            raise ValueError("phase must be one of %s, not %r" % (", ".join(PHASES), category))
        token = self._open_phase(category)
        try:
            yield
        finally:
            if token is not None:
                self._close_phase(token)

    # -- accounting --------------------------------------------------------------------------------------------

    def _count_copy(self, pageable):
        self._copies += 1
        self._pageable_copies += bool(pageable)

    def _fail(self, where, error):
        """The doctor's own trouble: said once, accounting stops, the loop goes on."""
        if self._failed is None:
            self._failed = "%s: %s: %s" % (where, type(error).__name__, error)
            self.cannot_see.append("the rest of the run: the doctor stopped after an error of its own (%s)" %
                                   self._failed)
            print("stoker doctor: stopped accounting after an error of its own in %s; the training loop goes on"
                  % self._failed, file=sys.stderr)

    def _grad_enabled(self):
        torch = self._torch or sys.modules.get("torch")
        return torch is None or torch.is_grad_enabled()

    def _begin_batch(self, training):
        now = self._clock()
        if training is None:
            training = self._grad_enabled()
        with self._step_lock:
            if self._closed:
                return None
            self._loop_thread = threading.get_ident()
            if not training:
                if self._current is not None:
                    self._end_step(now)
                if self._eval_since is None:
                    self._eval_since = now
                    if self._nvml is not None:
                        self._nvml.counting = False
                with self._lock:
                    self._evaluation["batches"] += 1
                return _EVALUATION
            if self._eval_since is not None:
                self._end_evaluation(now)
            step = self._current
            if step is None or step.boundary or not self._optimizer_mode or step.optimizer_steps > 0:
                if step is not None:
                    self._end_step(now)
                step = self._current = _Step(now)
                self._started += 1
                if self._started == self.warmup_steps + 1 and self._nvml is not None:
                    self._nvml.counting = True
            step.batches += 1
            return step, self._open_span(step, "data_wait", now)

    def _end_evaluation(self, now):
        with self._lock:
            self._evaluation["wall_s"] += now - self._eval_since
        self._eval_since = None
        if self._nvml is not None and self._started > self.warmup_steps:
            self._nvml.counting = True

    def _open_phase(self, category):
        if self._failed is not None or threading.get_ident() != self._loop_thread:
            return None
        try:
            self._phase_depth += 1
            if self._phase_depth > 1:
                return [None]
            with self._step_lock:
                step = self._current
                if step is None or self._closed:
                    return [None]
                return [self._open_span(step, category, self._clock())]
        except Exception as e:  # noqa: BLE001
            self._fail("phase(%r)" % category, e)
            return [None]

    def _close_phase(self, token):
        self._phase_depth -= 1
        if token[0] is not None:
            token[0][2] = self._clock()

    def _open_span(self, step, category, start):
        self._take_communication(step, start)
        # The event marks the work queued before the stall: when it completes, the GPU has nothing left.
        event = self._gpu.record() if self._gpu is not None else None
        span = [category, start, start, event]
        step.spans.append(span)
        return span

    def _take_communication(self, step, now):
        """Files the communication spans seen off the phases (DDP's backward
        waiting for its all-reduce) into the step, after its other spans."""
        for a, b in self._comm.take():
            a, b = max(a, max([step.start] + [s[2] for s in step.spans])), min(b, now)
            if b > a:
                step.spans.append(["communication", a, b, None])

    def communication_waited(self, a, b):
        """The loop's thread waited on communication from a to b outside a
        phase (the seam the DDP hooks use)."""
        if threading.get_ident() == self._loop_thread:
            self._comm.add(a, b)

    def _end_step(self, now):
        step, self._current = self._current, None
        self._take_communication(step, now)
        step.end = now
        self._pending.append(step)
        self._settle_ready(wait=False)

    def _settle_ready(self, wait):
        # Steps settle in order once their events completed: checked at later steps, never a host wait.
        while self._pending:
            step = self._pending[0]
            events = [s[3] for s in step.spans if s[3] is not None]
            if not wait and not all(self._gpu.done(e) for e in events):
                break
            for e in events:
                self._gpu.wait(e)
            self._pending.popleft()
            self._settle(step)

    def _settle(self, step):
        spans = [(c, a, b, None if e is None else self._gpu.time(e)) for c, a, b, e in step.spans]
        step.seconds = attribute(step.start, step.end, spans, self._busy_fraction)
        wall = step.end - step.start
        with self._lock:
            if not step.boundary and self._settled < self.warmup_steps:
                self._settled += 1
                self._warmup["steps"] += 1
                self._warmup["wall_s"] += wall
                return
            self.wall += wall
            for c in CATEGORIES:
                self.totals[c] += step.seconds[c]
            for c, a, b, _ in spans:
                self.host_totals[c] += b - a
                self.stall_counts[c] += 1
            if step.boundary:
                return
            self._settled += 1
            self.steps += 1
            self._micro_batches += step.batches
            self._histogram[_bucket(wall)] += 1
            # The median of recent steps, refreshed every 32 steps (sorting 512 each step would cost more
            # than the rest of the accounting).
            if self.steps % 32 == 1 or self._median is None:
                self._median = _median(self._durations)
            median = self._median
            self._durations.append(wall)
            self._recent.append(step)
            if median is not None and wall > self._slow_factor * median:
                self._slow.append(step)

    # -- outputs -----------------------------------------------------------------------------------------------

    def account(self):
        """Totals of the counted steps: {"steps", "wall_s", "seconds":
        {category: s} (adding up to wall_s), "share": {category: 0..1},
        "host_seconds": {stall: s the training thread spent in it},
        "nvml_utilization" (mean percent over the counted steps, or None),
        "warmup" and "evaluation" (what was timed and not counted),
        "micro_batches" (batches in the counted steps)}. Where NVML's
        utilisation says the GPU idled more than the stalls explain (and no
        finer source is given), the difference moves from compute to
        launch."""
        with self._lock:
            seconds = dict(self.totals)
            host = dict(self.host_totals)
            wall, steps = self.wall, self.steps
            warmup, evaluation = dict(self._warmup), dict(self._evaluation)
            micro = self._micro_batches
        utilization = self._nvml.mean_utilization() if self._nvml is not None else None
        if utilization is not None and self._busy_fraction is None and self._gpu is not None and wall > 0:
            idle_seen = sum(seconds[c] for c in STALLS) + seconds["launch"]
            unseen = max(0.0, (1.0 - utilization / 100.0) * wall - idle_seen)
            moved = min(unseen, seconds["compute"])
            seconds["compute"] -= moved
            seconds["launch"] += moved
        share = {c: (seconds[c] / wall if wall > 0 else 0.0) for c in CATEGORIES}
        return {"steps": steps, "wall_s": wall, "seconds": seconds, "share": share, "host_seconds": host,
                "nvml_utilization": utilization, "warmup": warmup, "evaluation": evaluation,
                "micro_batches": micro}

    def verdict(self):
        """[(finding, fix, predicted steps/s gain as a fraction)] most costly first."""
        return _advice.verdict(self)

    def report(self):
        """The account, one line per category, the verdict, and what was not counted."""
        return _advice.report(self)

    def what_if_perfect_loader(self, step, batch, steps=30):
        """Checks the input-bound prediction by experiment: runs ``step(batch)``
        ``steps`` times on a batch already in hand (a loader that is never
        waited for) and compares its steps/s with the loop's measured rate
        and with the rate the account predicts without data wait. Returns
        {"measured_steps_per_s", "predicted_steps_per_s",
        "replayed_steps_per_s", "prediction_error"} and adds a line to the
        report."""
        self._what_if = _advice.what_if_perfect_loader(self, step, batch, steps)
        return dict(self._what_if)

    def prometheus_text(self):
        """The metrics in Prometheus' text exposition format."""
        with self._lock:
            histogram = list(self._histogram)
        window = self._nvml.window_utilization() if self._nvml is not None else None
        return _export.prometheus_text(self.account(), histogram, window)

    def serve(self, port, host="127.0.0.1", tries=16):
        """Serves prometheus_text() at http://host:port/metrics from a daemon
        thread (port 0: any free port); returns the port. A port in use is
        passed over for the next of ``tries`` ports (a warning on stderr);
        when none is free, or the address cannot be bound, it warns and
        returns None: monitoring never stops the training."""
        self._server, why = _export.serve_metrics(self.prometheus_text, port, host, tries)
        if self._server is None:
            print("stoker doctor: not serving metrics: %s" % why, file=sys.stderr)
            return None
        bound = self._server.server_address[1]
        if port and bound != port:
            print("stoker doctor: port %d is in use; serving metrics on %d" % (port, bound), file=sys.stderr)
        return bound

    def chrome_trace(self):
        """Trace Event JSON (chrome://tracing, Perfetto) of the last steps and
        the slow ones: a span per step and per category inside it."""
        with self._lock:
            steps = {id(s): s for s in list(self._slow) + list(self._recent)}.values()
        return _export.chrome_trace(sorted(steps, key=lambda s: s.start), self._origin)


def _bucket(seconds):
    for i, bound in enumerate(BUCKETS):
        if seconds <= bound:
            return i
    return len(BUCKETS)


def _median(values):
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
