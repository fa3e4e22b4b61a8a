"""The attribution of one step's wall time, on the host's clock.

A step is a window of host time holding stall spans (data wait, copy,
checkpoint, sync, communication: the host ran no training code and queued
no GPU work during them) and the step's own code between them. For each
stall span the GPU's timing says when the work queued before it finished
(`gpu_free`, from a CUDA event recorded as the span began): the GPU computed
until then and was idle, waiting on that stall, from then to the span's end.
The step's own code is compute, unless a busy-fraction source (NVML) says
the GPU was idle part of it: then that part is launch time (the host did not
queue work fast enough). Without a GPU, a stall span is idle throughout."""

CATEGORIES = ("compute", "data_wait", "h2d_copy", "checkpoint", "launch", "sync", "communication", "other")
STALLS = ("data_wait", "h2d_copy", "checkpoint", "sync", "communication")


def attribute(start, end, spans, busy_fraction=None):
    """Seconds by category (CATEGORIES) for the window [start, end), adding up
    to end - start. spans: (category, a, b, gpu_free) inside the window, not
    overlapping; gpu_free None when there is no GPU timing. busy_fraction:
    None, or a function (t0, t1) -> share of [t0, t1) the GPU computed."""
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    cursor = start
    for category, a, b, gpu_free in sorted(spans, key=lambda s: s[1]):
        a, b = max(a, start), min(b, end)
        if b <= a:
            continue
        _body(seconds, cursor, a, busy_fraction)
        free = a if gpu_free is None else min(max(gpu_free, a), b)
        seconds["compute"] += free - a  # the GPU still ran what was queued before the stall
        seconds[category] += b - free
        cursor = max(cursor, b)
    _body(seconds, cursor, end, busy_fraction)
    total = end - start
    seconds["other"] = max(0.0, total - sum(v for k, v in seconds.items() if k != "other"))
    return seconds


def _body(seconds, a, b, busy_fraction):
    if b <= a:
        return
    share = 1.0 if busy_fraction is None else min(1.0, max(0.0, busy_fraction(a, b)))
    seconds["compute"] += (b - a) * share
    seconds["launch"] += (b - a) * (1.0 - share)
