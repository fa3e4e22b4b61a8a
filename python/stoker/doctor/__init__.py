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

Outputs: ``report()`` (the account and a verdict with a fix and a predicted
gain), ``prometheus_text()`` (the text exposition format; ``serve(port)``
exposes it), ``chrome_trace()`` (Trace Event JSON of the last steps and of
slow ones, bounded).
"""
import collections
import contextlib
import json
import os
import threading
import time

from . import _export, _gpu
from ._export import BUCKETS
from ._timeline import CATEGORIES, STALLS, attribute

# The stalls a phase() block marks (data wait is marked by the batches themselves).
PHASES = tuple(s for s in STALLS if s != "data_wait")


class _Step:
    __slots__ = ("start", "end", "spans", "seconds", "boundary")

    def __init__(self, start):
        self.start, self.end = start, None
        self.boundary = False  # only the wait that found the end of the data: its time counts, not as a step
        self.spans = []  # [category, start, end, gpu event at the start or None]
        self.seconds = None


class Doctor:
    """Accounts for every step of a training loop (see the module's help).

    ``cuda``: time the GPU with CUDA events on torch's current stream
    (default: when torch sees a GPU). ``nvml``: sample NVML's utilisation and
    memory (default: when NVML loads). ``trace_steps``: steps kept in full
    for ``chrome_trace()`` (the last ones), plus up to as many slow ones (over
    ``slow_factor`` times the median). Seams for tests: ``clock`` (seconds),
    ``gpu`` (record/done/wait/time, as _gpu.TorchGpuTimer), ``busy_fraction``
    ((t0, t1) -> share of the time the GPU computed)."""

    def __init__(self, cuda=None, nvml=None, trace_steps=64, slow_factor=3.0, clock=time.perf_counter, gpu=None,
                 busy_fraction=None, mtbf_hours=24.0):
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
        self._nvml = None
        if nvml is None or nvml:
            handle, why = _gpu.open_nvml(self._torch.cuda.current_device() if self._torch else 0)
            if handle is not None:
                self._nvml = _gpu.NvmlSampler(handle)
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
        self._durations = collections.deque(maxlen=512)  # recent step durations, for the median
        self._median = None
        self._histogram = [0] * (len(BUCKETS) + 1)
        self._recent = collections.deque(maxlen=trace_steps)
        self._slow = collections.deque(maxlen=trace_steps)
        self._slow_factor = slow_factor
        self._pending = collections.deque()  # ended steps whose GPU events are not all done
        self._current = None
        self._phase = None
        self._loader = None
        self._pageable_copies = 0
        self._copies = 0
        self._lock = threading.Lock()
        self._what_if = None
        self._closed = False
        self._server = None
        self._origin = clock()

    # -- the loop ----------------------------------------------------------------------------------------------

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Ends the step in progress (its time counts), settles every step and
        stops the NVML sampler and the endpoint. Closing twice is harmless."""
        if self._closed:
            return
        self._closed = True
        if self._current is not None:
            self._end_step(self._clock())
        self._settle_ready(wait=True)
        if self._nvml is not None:
            self._nvml.stop()
            if self._nvml.error:
                self.cannot_see.append("NVML stopped answering: " + self._nvml.error)
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
            try:
                batch = self.next_batch(lambda: next(it))
            except StopIteration:
                return  # the wait that found the end of the data is kept: it is the epoch boundary's
            if device is not None:
                with self.phase("h2d_copy"):
                    batch = self._to_device(batch, device)
            yield batch

    def next_batch(self, fetch):
        """Ends the current step, starts the next and returns ``fetch()``, its
        time counted as data wait (what ``batches`` does for each batch; for
        hooking iterators directly). Exceptions from ``fetch`` pass through."""
        start = self._clock()
        if self._current is not None:
            self._end_step(start)
        self._current = _Step(start)
        span = self._open_span("data_wait", start)
        try:
            return fetch()
        except StopIteration:
            self._current.boundary = True
            raise
        finally:
            span[2] = self._clock()

    @contextlib.contextmanager
    def phase(self, category):
        """Counts the block as a stall of ``category`` (one of PHASES) in the
        current step: the GPU's idle time during it is that category's."""
        if category not in PHASES:
            raise ValueError("phase must be one of %s, not %r" % (", ".join(PHASES), category))
        if self._phase is not None:
            raise RuntimeError("phase(%r) inside phase(%r): phases do not nest" % (category, self._phase))
        self._phase = category
        span = self._open_span(category, self._clock()) if self._current is not None else None
        try:
            yield
        finally:
            self._phase = None
            if span is not None:
                span[2] = self._clock()

    # -- accounting --------------------------------------------------------------------------------------------

    def _open_span(self, category, start):
        # The event marks the work queued before the stall: when it completes, the GPU has nothing left.
        event = self._gpu.record() if self._gpu is not None else None
        span = [category, start, start, event]
        self._current.spans.append(span)
        return span

    def _end_step(self, now):
        step, self._current = self._current, None
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
            self.wall += wall
            for c in CATEGORIES:
                self.totals[c] += step.seconds[c]
            for c, a, b, _ in spans:
                self.host_totals[c] += b - a
                self.stall_counts[c] += 1
            if step.boundary:
                return
            self.steps += 1
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
        """Totals since the start: {"steps", "wall_s", "seconds": {category: s}
        (adding up to wall_s), "share": {category: 0..1}, "host_seconds":
        {stall: s the training thread spent in it}, "nvml_utilization"
        (mean percent, or None)}. Where NVML's utilisation says the GPU
        idled more than the stalls explain (and no finer source is given),
        the difference moves from compute to launch."""
        with self._lock:
            seconds = dict(self.totals)
            host = dict(self.host_totals)
            wall, steps = self.wall, self.steps
        utilization = self._nvml.mean_utilization() if self._nvml is not None else None
        if utilization is not None and self._busy_fraction is None and self._gpu is not None and wall > 0:
            idle_seen = sum(seconds[c] for c in STALLS) + seconds["launch"]
            unseen = max(0.0, (1.0 - utilization / 100.0) * wall - idle_seen)
            moved = min(unseen, seconds["compute"])
            seconds["compute"] -= moved
            seconds["launch"] += moved
        share = {c: (seconds[c] / wall if wall > 0 else 0.0) for c in CATEGORIES}
        return {"steps": steps, "wall_s": wall, "seconds": seconds, "share": share, "host_seconds": host,
                "nvml_utilization": utilization}

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
            saves = max(1, self.stall_counts["checkpoint"])
            cost = a["seconds"]["checkpoint"] / saves
            # Young's interval: the one that loses least to saving and to recomputing after a failure.
            interval = (2.0 * cost * self._mtbf_s) ** 0.5
            findings.append(("checkpoint stalls: %.0f%% of step time saving (%d saves, %.2f s each)" % (
                100 * share["checkpoint"], saves, cost),
                "save with stoker.checkpoint.Checkpointer: training waits only for the snapshot, the write goes on "
                "in the background; at this cost and a mean time between failures of %.0f h, save every %.0f s"
                % (self._mtbf_s / 3600.0, interval), gain(share["checkpoint"])))
        if share["h2d_copy"] > 0.05:
            pageable = self._pageable_copies and self._pageable_copies == self._copies
            findings.append(("host-to-device copies: %.0f%% of step time%s" % (
                100 * share["h2d_copy"], " from pageable memory" if pageable else ""),
                "pageable copies: use stoker.Loader(device=\"cuda\") (pinned buffers, its own copy stream) or "
                "pin_memory=True" if pageable else "copy on a side stream: stoker.Loader(device=\"cuda\")",
                gain(share["h2d_copy"])))
        host_sync = a["host_seconds"]["sync"] / a["wall_s"] if a["wall_s"] > 0 else 0.0
        if max(share["sync"], host_sync) > 0.05:
            # While the host waits for the GPU the GPU computes; the cost is the queue it drains, which the
            # next stall then cannot hide. The host's share bounds it.
            findings.append(("synchronisation stalls: the training thread waited for the GPU %.0f%% of step time "
                             "(e.g. .item() each step)" % (100 * host_sync),
                             "read losses every N steps, or keep them on the GPU and sum there (predicted gain: "
                             "at most)", gain(max(share["sync"], host_sync))))
        if share["communication"] > 0.05:
            findings.append(("exposed communication: %.0f%% of step time" % (100 * share["communication"]),
                             "overlap the gradient all-reduce with the backward pass (DDP buckets) or use a "
                             "larger batch per rank", gain(share["communication"])))
        if share["launch"] > 0.10:
            findings.append(("launch-bound: the GPU waited %.0f%% of step time for the host to queue work" % (
                100 * share["launch"]), "capture the step in a CUDA graph or torch.compile it; " + self._launch_fix(),
                gain(share["launch"])))
        findings.sort(key=lambda f: -f[2])
        return findings

    def what_if_perfect_loader(self, step, batch, steps=30):
        """Checks the input-bound prediction by experiment: runs ``step(batch)``
        ``steps`` times on a batch already in hand (a loader that is never
        waited for) and compares its steps/s with the loop's measured rate
        and with the rate the account predicts without data wait. Returns
        {"measured_steps_per_s", "predicted_steps_per_s",
        "replayed_steps_per_s", "prediction_error"} and adds a line to the
        report."""
        a = self.account()
        if a["steps"] == 0 or a["wall_s"] <= 0:
            raise RuntimeError("what_if_perfect_loader: no steps measured yet")
        measured = a["steps"] / a["wall_s"]
        predicted = measured / max(1e-9, 1.0 - a["share"]["data_wait"])
        if self._torch is not None:
            self._torch.cuda.synchronize()
        start = self._clock()
        for _ in range(steps):
            step(batch)
        if self._torch is not None:
            self._torch.cuda.synchronize()
        replayed = steps / (self._clock() - start)
        self._what_if = {"measured_steps_per_s": measured, "predicted_steps_per_s": predicted,
                         "replayed_steps_per_s": replayed, "prediction_error": predicted / replayed - 1.0}
        return dict(self._what_if)

    def _launch_fix(self):
        cores = os.cpu_count() or 1
        threads = self._loader.stats().get("threads") if self._loader is not None else None
        if threads is not None and threads >= cores:
            return "the training thread competes with the loader's %d threads on %d cores: num_threads=%d or \"auto\"" % (
                threads, cores, max(1, cores - 1))
        return "give the training thread a core of its own"

    def _input_fix(self):
        if self._loader is None:
            return "use stoker.Loader (native threads, no worker processes) with device=\"cuda\""
        stats = self._loader.stats()
        threads = stats.get("threads")
        cores = os.cpu_count() or 1
        if threads is not None and threads >= cores - 1:
            return ("the loader's %d threads are saturated: gpu_preprocess=True, decode=\"gpu\", or a lighter "
                    "dataset (stoker pack --max-side 400, which pays when many images are larger: stoker inspect "
                    "--images 1000 shows how many)" % threads)
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
        if self._what_if is not None:
            w = self._what_if
            lines.append("what if the loader were never waited for: replaying one batch ran %.1f steps/s, the "
                         "account predicted %.1f (%+.0f%%), the loop ran %.1f" % (
                             w["replayed_steps_per_s"], w["predicted_steps_per_s"], 100 * w["prediction_error"],
                             w["measured_steps_per_s"]))
        tuned = self._loader.autotune_log() if self._loader is not None and hasattr(self._loader,
                                                                                     "autotune_log") else []
        if tuned:
            stats = self._loader.stats()
            lines.append("loader autotune: now %d threads, prefetch %d; its decisions:" % (stats["threads"],
                                                                                         stats["prefetch"]))
            lines += ["  " + line for line in tuned[-10:]]
        if a["nvml_utilization"] is not None:
            lines.append("NVML utilisation: %.0f%% (stoker's account: %.0f%% compute); GPU memory peak %.1f of "
                         "%.1f GiB" % (a["nvml_utilization"], 100 * a["share"]["compute"],
                                       self._nvml.memory_used_max / 2**30, self._nvml.memory_total / 2**30))
        host = {c: v for c, v in a["host_seconds"].items() if v > 0}
        if host:
            lines.append("training thread blocked in: " + ", ".join("%s %.3f s" % kv for kv in host.items()))
        for what in self.cannot_see:
            lines.append("could not see: " + what)
        return "\n".join(lines)

    def prometheus_text(self):
        """The metrics in Prometheus' text exposition format."""
        with self._lock:
            histogram = list(self._histogram)
        return _export.prometheus_text(self.account(), histogram)

    def serve(self, port, host="127.0.0.1"):
        """Serves prometheus_text() at http://host:port/metrics from a daemon thread
        (port 0: any free port); returns the port."""
        self._server = _export.serve_metrics(self.prometheus_text, port, host)
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
            for category, start, end, _ in step.spans:
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
