"""Test doubles for code that uses the doctor: an exact clock and a GPU
stream with known kernel durations (the doctor's timer seam), so that its
attribution can be checked against ground truth without a GPU, and
planted host stalls whose real durations are the ground truth."""
import time


class Planted:
    """Ground truth: the time each planted stall actually took."""

    def __init__(self):
        self.seconds = {}

    def sleep(self, category, seconds):
        start = time.perf_counter()
        time.sleep(seconds)
        self.seconds[category] = self.seconds.get(category, 0.0) + time.perf_counter() - start


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def advance(self, seconds):
        self.now += seconds


class FakeGpuQueue:
    """A stream: kernels run one after another from when they are launched;
    an event completes when the queue reaches it. `depth`: seconds of work
    the host may queue ahead before a launch blocks (CUDA's launch queue)."""

    def __init__(self, clock, depth=float("inf")):
        self.clock, self.depth, self.end, self.busy, self.sync_wait = clock, depth, 0.0, [], 0.0

    def launch(self, seconds, host_cost=0.00005):
        if self.end - self.clock.now > self.depth:
            self.clock.now = self.end - self.depth
        start = max(self.clock.now, self.end)
        self.end = start + seconds
        self.busy.append((start, self.end))
        self.clock.advance(host_cost)

    def synchronize(self):
        self.sync_wait += max(0.0, self.end - self.clock.now)
        self.clock.now = max(self.clock.now, self.end)

    # The doctor's timer seam.
    def record(self):
        return max(self.clock.now, self.end)

    def done(self, event):
        return self.clock.now >= event

    def wait(self, event):
        pass

    def time(self, event):
        return event

    def busy_between(self, a, b):
        return sum(max(0.0, min(e, b) - max(s, a)) for s, e in self.busy)

    def busy_fraction(self, a, b):
        return self.busy_between(a, b) / (b - a) if b > a else 1.0
