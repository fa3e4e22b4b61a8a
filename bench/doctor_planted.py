"""The doctor's attribution error on planted stalls (the figures for the
README and the issue's note): on the host clock, a loader slowed by 20 and
50 ms, a synchronous 200 ms checkpoint, a 5 ms sync each step (time.sleep
stands for each, its real duration measured); on a fake GPU queue with
known kernel durations, the GPU-side cases (exact clocks). For each: the
planted time, what the doctor attributed, and the error.

    PYTHONPATH=build/release/python .venv/bin/python bench/doctor_planted.py
"""
import json

from stoker.doctor import Doctor
from stoker.doctor.testing import FakeClock, FakeGpuQueue, Planted


def host_case(name, steps=30, data=0.0, compute=0.010, checkpoint_every=0, sync=0.0):
    planted = Planted()
    doc = Doctor(cuda=False, nvml=False, warmup_steps=0)

    def batches():
        for i in range(steps):
            if data:
                planted.sleep("data_wait", data)
            yield i
    for step in doc.batches(batches()):
        planted.sleep("compute", compute)
        if sync:
            with doc.phase("sync"):
                planted.sleep("sync", sync)
        if checkpoint_every and step % checkpoint_every == checkpoint_every - 1:
            with doc.phase("checkpoint"):
                planted.sleep("checkpoint", 0.200)
    doc.close()
    got = doc.account()["seconds"]
    stalls = {k: v for k, v in planted.seconds.items() if k != "compute"}
    rows = [{"case": name, "stall": k, "planted_s": v, "attributed_s": got[k], "error": got[k] / v - 1}
            for k, v in stalls.items()]
    misattributed = sum(abs(got[k] - v) for k, v in stalls.items())
    return rows, misattributed / sum(stalls.values())


def queue_case(name, loop, fine=False):
    clock = FakeClock()
    queue = FakeGpuQueue(clock)
    doc = Doctor(clock=clock, gpu=queue, nvml=False, warmup_steps=0, busy_fraction=queue.busy_fraction if fine else None)
    truth = loop(doc, clock, queue)
    doc.close()
    a = doc.account()
    busy = queue.busy_between(0.0, a["wall_s"])
    rows = [{"case": name, "stall": k, "planted_s": v, "attributed_s": a["seconds"][k],
             "error": a["seconds"][k] / v - 1 if v else a["seconds"][k]} for k, v in truth.items()]
    rows.append({"case": name, "stall": "compute (GPU busy)", "planted_s": busy, "attributed_s": a["seconds"]["compute"],
                 "error": a["seconds"]["compute"] / busy - 1})
    return rows


def slow_loader(doc, clock, queue):
    def data():
        for _ in range(30):
            clock.advance(0.050)
            yield 0
    for _ in doc.batches(data()):
        for _ in range(20):
            queue.launch(0.001)
    return {"data_wait": 0.050 + 29 * 0.031}  # the first wait whole, then what queued work did not hide


def tiny_launches(doc, clock, queue):
    for _ in doc.batches(range(20)):
        for _ in range(100):
            queue.launch(0.00001, host_cost=0.0001)
    return {"launch": 20 * 100 * 0.00009}


def main():
    rows, worst_misattributed = [], 0.0
    for name, kw in (("loader +20 ms", {"data": 0.020}), ("loader +50 ms", {"data": 0.050}),
                     ("checkpoint 200 ms every 10 steps", {"checkpoint_every": 10}),
                     ("sync 5 ms each step", {"sync": 0.005})):
        r, mis = host_case(name, **kw)
        rows += r
        worst_misattributed = max(worst_misattributed, mis)
    rows += queue_case("GPU queue: slow loader, queued work hides part", slow_loader)
    rows += queue_case("GPU queue: tiny launches (busy source)", tiny_launches, fine=True)
    for r in rows:
        print("%-48s %-20s planted %8.4f s  attributed %8.4f s  error %+6.2f%%" % (
            r["case"], r["stall"], r["planted_s"], r["attributed_s"], 100 * r["error"]))
    print("largest share of planted stall time misattributed (host clock): %.2f%%" % (100 * worst_misattributed))
    print(json.dumps({"rows": rows, "worst_misattributed": worst_misattributed}))


if __name__ == "__main__":
    main()
