"""The doctor's units of account: a step and its stall spans, and the marks
DDP's comm hook leaves for the communication span."""
import threading


class _Step:
    __slots__ = ("start", "end", "spans", "seconds", "boundary", "optimizer_steps", "batches")

    def __init__(self, start):
        self.start, self.end = start, None
        self.boundary = False  # only the wait that found the end of the data: its time counts, not as a step
        self.spans = []  # [category, start, end, gpu event at the start or None]
        self.seconds = None
        self.optimizer_steps = 0
        self.batches = 0


class _CommMarks:
    """Spans of communication seen off the phases (DDP's backward pass
    waiting for its all-reduce), kept until the loop's thread files them
    into the step."""

    def __init__(self):
        self._lock = threading.Lock()
        self._spans = []

    def add(self, a, b):
        with self._lock:
            self._spans.append((a, b))

    def take(self):
        with self._lock:
            spans, self._spans = self._spans, []
            return spans


def to_device(batch, device, count):
    """``batch`` with its tensors moved to ``device`` (non-blocking);
    count(pageable) for each tensor moved."""
    if hasattr(batch, "to") and hasattr(batch, "is_pinned"):
        count(batch.device.type == "cpu" and not batch.is_pinned())
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(b, device, count) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device, count) for k, v in batch.items()}
    return batch
