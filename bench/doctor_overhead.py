"""The doctor's cost: host time per step of the accounting (an empty loop of
N steps with and without it), per hooked Tensor.item call (stoker doctor's
hooks), and the size of what it writes (the trace is bounded however long
the run). Prints one JSON line.

    PYTHONPATH=build/release/python .venv/bin/python bench/doctor_overhead.py
"""
import json
import time

import torch

from stoker.doctor import Doctor, _auto


def per_step(steps):
    t0 = time.perf_counter()
    for _ in range(steps):
        pass
    bare = time.perf_counter() - t0
    doc = Doctor(cuda=False, nvml=False, warmup_steps=0)
    t0 = time.perf_counter()
    for _ in doc.batches(range(steps)):
        pass
    doc.close()
    return (time.perf_counter() - t0 - bare) / steps, doc


def per_item(calls):
    x = torch.zeros(())
    t0 = time.perf_counter()
    for _ in range(calls):
        x.item()
    bare = time.perf_counter() - t0
    _auto._patch_torch(torch)
    doc = _auto.doctor()
    t0 = time.perf_counter()
    for _ in doc.batches(range(calls)):
        x.item()
    hooked = time.perf_counter() - t0
    doc.close()
    return (hooked - bare) / calls


def main():
    step_s, doc = per_step(100_000)
    trace = doc.chrome_trace()
    item_s = per_item(100_000)
    result = {"per_step_us": 1e6 * step_s, "per_step_and_item_us": 1e6 * item_s,
              "share_of_a_10ms_step": step_s / 0.010, "share_of_a_50ms_step": step_s / 0.050,
              "trace_bytes_after_100k_steps": len(trace), "prometheus_bytes": len(doc.prometheus_text())}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
