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
for the next. Categories (``CATEGORIES``): ``data_wait`` (inside the
loader's ``next()``), ``h2d_copy``, ``checkpoint``, ``sync`` and
``communication`` (inside ``phase(...)`` blocks of those names, or measured
by ``batches(..., device=)`` for the copy), ``compute`` (the rest; on a GPU,
the GPU's time on torch's stream from CUDA events), ``launch`` (with CUDA:
the rest of the step the GPU was not computing, i.e. the host did not queue
work fast enough), and ``other`` (never negative rounding). Host clocks and
CUDA events only: no profiler, no root.

Outputs: ``report()`` (the account and a verdict with a fix and a predicted
gain), ``prometheus_text()`` (the text exposition format; ``serve(port)``
exposes it), ``chrome_trace()`` (Trace Event JSON of the last steps and of
slow ones, bounded).
"""
import collections
import contextlib
import http.server
import json
import os
import threading
import time

CATEGORIES = ("compute", "data_wait", "h2d_copy", "checkpoint", "launch", "sync", "communication", "other")
PHASES = ("h2d_copy", "checkpoint", "sync", "communication")
# Step-duration histogram buckets, seconds.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class _Step:
    __slots__ = ("start", "end", "seconds", "spans", "gpu_events", "gpu_seconds")

    def __init__(self, start):
        self.start, self.end = start, None
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.spans = []  # (category, start, end) for the trace
        self.gpu_events = None
        self.gpu_seconds = None


class Doctor:
    """Accounts for every step of a training loop (see the module's help).

    ``cuda``: measure the GPU's busy time with CUDA events on torch's
    current stream (default: when torch sees a GPU). ``trace_steps``: steps
    kept in full detail for ``chrome_trace()`` (the last ones), plus up to as
    many slow steps (over ``slow_factor`` times the median). ``clock``: a
    function returning seconds (tests plant a fake)."""

    def __init__(self, cuda=None, trace_steps=64, slow_factor=3.0, clock=time.perf_counter):
        self._clock = clock
        self._torch = None
        if cuda is None or cuda:
            try:
                import torch
                if torch.cuda.is_available():
                    self._torch = torch
            except ImportError:
                pass
            if cuda and self._torch is None:
                raise RuntimeError("Doctor(cuda=True): torch sees no CUDA device")
        self.cannot_see = []
        if self._torch is None:
            self.cannot_see.append("GPU time (no CUDA device): compute is the host's time in the step, and "
                                   "launch-bound steps cannot be told apart from compute-bound ones")
        self.totals = dict.fromkeys(CATEGORIES, 0.0)
        self.steps = 0
        self.wall = 0.0
        self._durations = collections.deque(maxlen=512)  # recent step durations, for the median
        self._histogram = [0] * (len(BUCKETS) + 1)
        self._recent = collections.deque(maxlen=trace_steps)
        self._slow = collections.deque(maxlen=trace_steps)
        self._slow_factor = slow_factor
        self._pending_gpu = collections.deque()
        self._current = None
        self._phase = None
        self._loader = None
        self._pageable_copies = 0
        self._copies = 0
        self._lock = threading.Lock()
        self._server = None
        self._origin = clock()

    # -- the loop ----------------------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends the step in progress (its time counts) and stops the endpoint."""
        now = self._clock()
        if self._current is not None:
            self._end_step(now)
        self._drain_gpu(wait=True)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def batches(self, iterable, device=None):
        """Yields ``iterable``'s batches, each step starting when the next batch
        is asked for; the time inside ``next()`` is data wait. With
        ``device``, tensors of each batch are moved there (non-blocking) and
        the time is counted as ``h2d_copy``; pageable sources are noted."""
        if hasattr(iterable, "stats") and hasattr(iterable, "summary"):
            self._loader = iterable
        it = iter(iterable)
        while True:
            start = self._clock()
            if self._current is not None:
                self._end_step(start)
            self._begin_step(start)
            try:
                batch = next(it)
            except StopIteration:
                # No step began: the time spent finding the end is the epoch boundary's data wait, kept.
                end = self._clock()
                self._current.seconds["data_wait"] += end - start
                self._current.spans.append(("data_wait", start, end))
                return
            got = self._clock()
            self._current.seconds["data_wait"] += got - start
            self._current.spans.append(("data_wait", start, got))
            if device is not None:
                with self.phase("h2d_copy"):
                    batch = self._to_device(batch, device)
            self._start_gpu_timing()
            yield batch

    @contextlib.contextmanager
    def phase(self, category):
        """Counts the block's time as ``category`` (one of PHASES) in the
        current step."""
        if category not in PHASES:
            raise ValueError("phase must be one of %s, not %r" % (", ".join(PHASES), category))
        if self._phase is not None:
            raise RuntimeError("phase(%r) inside phase(%r): phases do not nest" % (category, self._phase))
        self._phase = category
        start = self._clock()
        try:
            yield
        finally:
            end = self._clock()
            self._phase = None
            if self._current is not None:
                self._current.seconds[category] += end - start
                self._current.spans.append((category, start, end))

    # -- accounting --------------------------------------------------------------------------------------------

    def _begin_step(self, now):
        self._current = _Step(now)

    def _start_gpu_timing(self):
        if self._torch is None or self._current is None:
            return
        start = self._torch.cuda.Event(enable_timing=True)
        start.record()
        self._current.gpu_events = [start, None]

    def _end_step(self, now):
        step, self._current = self._current, None
        step.end = now
        if step.gpu_events is not None:
            end = self._torch.cuda.Event(enable_timing=True)
            end.record()
            step.gpu_events[1] = end
            self._pending_gpu.append(step)
            self._drain_gpu(wait=False)
        else:
            self._settle(step)

    def _drain_gpu(self, wait):
        # Steps are settled when their end event completed: a later step, not a host wait.
        while self._pending_gpu:
            step = self._pending_gpu[0]
            start, end = step.gpu_events
            if not wait and not end.query():
                break
            end.synchronize()
            step.gpu_seconds = start.elapsed_time(end) / 1000.0
            self._pending_gpu.popleft()
            self._settle(step)

    def _settle(self, step):
        wall = step.end - step.start
        s = step.seconds
        measured = sum(s[c] for c in ("data_wait",) + PHASES)
        body = max(0.0, wall - measured)
        if step.gpu_seconds is not None:
            # The GPU's busy time within the step body; the rest of the body the GPU waited for the host.
            s["compute"] = min(step.gpu_seconds, body)
            s["launch"] = body - s["compute"]
        else:
            s["compute"] = body
        s["other"] = max(0.0, wall - sum(s[c] for c in CATEGORIES if c != "other"))
        with self._lock:
            self.steps += 1
            self.wall += wall
            for c in CATEGORIES:
                self.totals[c] += s[c]
            self._histogram[_bucket(wall)] += 1
            median = _median(self._durations)
            self._durations.append(wall)
            self._recent.append(step)
            if median is not None and wall > self._slow_factor * median:
                self._slow.append(step)

    def _to_device(self, batch, device):
        if hasattr(batch, "to") and hasattr(batch, "is_pinned"):
            self._copies += 1
            if batch.device.type == "cpu" and not batch.is_pinned():
                self._pageable_copies += 1
            return batch.to(device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._to_device(b, device) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to_device(v, device) for k, v in batch.items()}
        return batch

    # -- outputs -----------------------------------------------------------------------------------------------

    def account(self):
        """Totals since the start: {"steps", "wall_s", "seconds": {category: s}, "share": {category: 0..1}}."""
        with self._lock:
            seconds = dict(self.totals)
            wall, steps = self.wall, self.steps
        share = {c: (seconds[c] / wall if wall > 0 else 0.0) for c in CATEGORIES}
        return {"steps": steps, "wall_s": wall, "seconds": seconds, "share": share}

    def verdict(self):
        """[(finding, fix, predicted steps/s gain as a fraction)] most costly first."""
        a = self.account()
        share = a["share"]
        findings = []

        def gain(lost):
            return lost / (1.0 - lost) if lost < 1.0 else float("inf")
        wait = share["data_wait"]
        if wait > 0.05:
            kind = "input-bound" if wait > 0.20 else "moderately input-bound"
            findings.append(("%s: %.0f%% of step time waiting for data" % (kind, 100 * wait),
                             self._input_fix(), gain(wait)))
        if share["checkpoint"] > 0.02:
            findings.append(("checkpoint stalls: %.0f%% of step time saving" % (100 * share["checkpoint"]),
                             "save with stoker.checkpoint.Checkpointer: training waits only for the snapshot, "
                             "the write goes on in the background; choose the interval from the measured cost",
                             gain(share["checkpoint"])))
        if share["h2d_copy"] > 0.05:
            pageable = self._pageable_copies and self._pageable_copies == self._copies
            findings.append(("host-to-device copies: %.0f%% of step time%s" % (
                100 * share["h2d_copy"], " from pageable memory" if pageable else ""),
                "pageable copies: use stoker.Loader(device=\"cuda\") (pinned buffers, its own copy stream) or "
                "pin_memory=True" if pageable else "copy on a side stream: stoker.Loader(device=\"cuda\")",
                gain(share["h2d_copy"])))
        if share["sync"] > 0.05:
            findings.append(("synchronisation stalls: %.0f%% of step time (e.g. .item() each step)" % (
                100 * share["sync"]), "read losses every N steps, or keep them on the GPU and sum there",
                gain(share["sync"])))
        if share["communication"] > 0.05:
            findings.append(("exposed communication: %.0f%% of step time" % (100 * share["communication"]),
                             "overlap the gradient all-reduce with the backward pass (DDP buckets) or use a "
                             "larger batch per rank", gain(share["communication"])))
        if share["launch"] > 0.10:
            findings.append(("launch-bound: the GPU waited %.0f%% of step time for the host to queue work" % (
                100 * share["launch"]), "capture the step in a CUDA graph or torch.compile it; give the training "
                "thread its own core (fewer loader threads)", gain(share["launch"])))
        findings.sort(key=lambda f: -f[2])
        return findings

    def _input_fix(self):
        if self._loader is None:
            return "use stoker.Loader (native threads, no worker processes) with device=\"cuda\""
        stats = self._loader.stats()
        threads = stats.get("threads")
        cores = os.cpu_count() or 1
        if threads is not None and threads >= cores - 1:
            return ("the loader's %d threads are saturated: gpu_preprocess=True, decode=\"gpu\", or a lighter "
                    "dataset (stoker pack --max-side 512)" % threads)
        return "raise the loader's num_threads (now %s of %d cores)" % (threads, cores)

    def report(self):
        """The account, one line per category, and the verdict."""
        a = self.account()
        lines = ["stoker doctor: %d steps, %.2f s, %.1f ms per step" % (
            a["steps"], a["wall_s"], 1000 * a["wall_s"] / a["steps"] if a["steps"] else 0.0)]
        for c in CATEGORIES:
            if a["seconds"][c] > 0 or c == "compute":
                lines.append("  %-14s %8.3f s  %5.1f%%" % (c, a["seconds"][c], 100 * a["share"][c]))
        findings = self.verdict()
        if not findings:
            lines.append("verdict: compute-bound (%.0f%% of step time computing): the loader and the stalls "
                         "cost little" % (100 * a["share"]["compute"]))
        for finding, fix, g in findings:
            lines.append("verdict: %s; fix: %s; predicted %+.0f%% steps/s" % (finding, fix, 100 * g))
        for what in self.cannot_see:
            lines.append("could not see: " + what)
        return "\n".join(lines)

    def prometheus_text(self):
        """The metrics in Prometheus' text exposition format."""
        a = self.account()
        with self._lock:
            histogram = list(self._histogram)
        out = ["# HELP stoker_gpu_idle_seconds_total Step time the GPU was not computing, by cause.",
               "# TYPE stoker_gpu_idle_seconds_total counter"]
        for c in CATEGORIES:
            if c != "compute":
                out.append('stoker_gpu_idle_seconds_total{cause="%s"} %r' % (c, a["seconds"][c]))
        out += ["# HELP stoker_compute_seconds_total Step time spent computing.",
                "# TYPE stoker_compute_seconds_total counter",
                "stoker_compute_seconds_total %r" % a["seconds"]["compute"],
                "# HELP stoker_steps_total Training steps accounted for.",
                "# TYPE stoker_steps_total counter",
                "stoker_steps_total %d" % a["steps"],
                "# HELP stoker_busy_ratio Share of step time spent computing.",
                "# TYPE stoker_busy_ratio gauge",
                "stoker_busy_ratio %r" % a["share"]["compute"],
                "# HELP stoker_step_duration_seconds Wall time of each step.",
                "# TYPE stoker_step_duration_seconds histogram"]
        cumulative = 0
        for bound, n in zip(BUCKETS, histogram):
            cumulative += n
            out.append('stoker_step_duration_seconds_bucket{le="%r"} %d' % (bound, cumulative))
        out.append('stoker_step_duration_seconds_bucket{le="+Inf"} %d' % (cumulative + histogram[-1]))
        out.append("stoker_step_duration_seconds_sum %r" % a["wall_s"])
        out.append("stoker_step_duration_seconds_count %d" % a["steps"])
        return "\n".join(out) + "\n"

    def serve(self, port, host="127.0.0.1"):
        """Serves prometheus_text() at http://host:port/metrics from a daemon thread
        (port 0: any free port); returns the port."""
        doctor = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = doctor.prometheus_text().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass
        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True, name="stoker-doctor-metrics").start()
        return self._server.server_address[1]

    def chrome_trace(self):
        """Trace Event JSON (chrome://tracing, Perfetto) of the last steps and
        the slow ones: a span per step and per category inside it."""
        with self._lock:
            steps = {id(s): s for s in list(self._slow) + list(self._recent)}.values()
        events = []
        pid = os.getpid()
        for step in sorted(steps, key=lambda s: s.start):
            us = lambda t: round((t - self._origin) * 1e6, 3)  # noqa: E731
            events.append({"name": "step", "cat": "step", "ph": "X", "ts": us(step.start),
                           "dur": round((step.end - step.start) * 1e6, 3), "pid": pid, "tid": 1,
                           "args": {c: round(v * 1e3, 3) for c, v in step.seconds.items() if v > 0}})
            for category, start, end in step.spans:
                events.append({"name": category, "cat": category, "ph": "X", "ts": us(start),
                               "dur": round((end - start) * 1e6, 3), "pid": pid, "tid": 1})
        return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})


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
