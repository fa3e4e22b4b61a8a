"""The doctor's figures for monitoring: Prometheus' text exposition format,
and a small HTTP server for it."""
import errno
import http.server
import json
import os
import threading

from ._timeline import CATEGORIES

# Upper bounds (seconds) of the step-duration histogram's buckets.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def prometheus_text(a, histogram, window_utilization=None):
    """`a`: Doctor.account(); `histogram`: step counts per bucket of BUCKETS
    (and one beyond); `window_utilization`: NVML's mean percent over the last
    minute, or None."""
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
    if window_utilization is not None:
        out += ["# HELP stoker_gpu_utilization_ratio NVML's utilisation of the process's device, last minute.",
                "# TYPE stoker_gpu_utilization_ratio gauge",
                "stoker_gpu_utilization_ratio %r" % (window_utilization / 100.0)]
    return "\n".join(out) + "\n"


def serve_metrics(text, port, host, tries=1):
    """Serves text() at http://host:port/metrics from a daemon thread, on the
    first free port of port, port + 1, ... (``tries`` of them; port 0: any).
    Returns (server, None), or (None, why) when none could be bound."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    why = None
    for candidate in ([0] if port == 0 else range(port, min(port + max(1, tries), 65536))):
        try:
            server = http.server.ThreadingHTTPServer((host, candidate), Handler)
        except OSError as e:
            why = "%s:%d: %s" % (host, candidate, e.strerror or e)
            if e.errno != errno.EADDRINUSE:
                break
            continue
        threading.Thread(target=server.serve_forever, daemon=True, name="stoker-doctor-metrics").start()
        return server, None
    if port and why and "in use" in why:
        why = "ports %d to %d on %s are in use" % (port, min(port + max(1, tries), 65536) - 1, host)
    return None, why or "no port to try"


def chrome_trace(steps, origin):
    """Trace Event JSON of settled steps (in order): a span per step and per category inside it."""
    events = []
    pid = os.getpid()
    for step in steps:
        us = lambda t: round((t - origin) * 1e6, 3)  # noqa: E731
        events.append({"name": "step", "cat": "step", "ph": "X", "ts": us(step.start),
                       "dur": round((step.end - step.start) * 1e6, 3), "pid": pid, "tid": 1,
                       "args": {c: round(v * 1e3, 3) for c, v in step.seconds.items() if v > 0}})
        for category, start, end, _ in step.spans:
            events.append({"name": category, "cat": category, "ph": "X", "ts": us(start),
                           "dur": round((end - start) * 1e6, 3), "pid": pid, "tid": 1})
    return json.dumps({"traceEvents": events, "displayTimeUnit": "ms"})
