#!/usr/bin/env python3
"""What the elastic runner's state costs: a model of --params parameters
with Adam's state (3x the parameters in float32), on --device.

    PYTHONPATH=build/release/python .venv/bin/python bench/elastic_snapshot.py --params 100e6
    (GPU check: --params 1e9 --device cuda)

Reports the training stall of one in-memory snapshot (stoker.Checkpointer to
/dev/shm: the copy into host buffers; the write runs in the background), the
background persist time, and the time to serialise the state for a peer
(torch.save into memory: what a rank sends a newcomer or a rank behind).
"""
import argparse
import io
import json
import os
import shutil
import tempfile
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=float, default=100e6)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dir", default="/dev/shm")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    import torch
    import stoker
    n = int(args.params)
    chunk = 50_000_000
    params = [torch.nn.Parameter(torch.randn(min(chunk, n - i), device=args.device)) for i in range(0, n, chunk)]
    opt = torch.optim.Adam(params, lr=1e-3)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()  # creates exp_avg and exp_avg_sq
    state = {"model": {"p%d" % i: p.data for i, p in enumerate(params)}, "optimizer": opt.state_dict()}
    total = sum(p.numel() for p in params) * 4 * 3
    work = tempfile.mkdtemp(prefix="stoker-snap-", dir=args.dir)
    ckpt = stoker.Checkpointer(os.path.join(work, "snap"), keep_last=2, when_busy="wait")
    stalls, persists, serial = [], [], []
    try:
        for step in range(args.repeats):
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            ckpt.save(step, state, rng=False)
            stalls.append(time.perf_counter() - t0)
            ckpt.wait()
            persists.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            buf = io.BytesIO()
            torch.save(state, buf)
            serial.append(time.perf_counter() - t0)
            del buf
    finally:
        ckpt.close()
        shutil.rmtree(work, ignore_errors=True)
    result = {"params": n, "state_bytes": total, "device": args.device,
              "snapshot_stall_s": round(min(stalls), 3), "snapshot_persist_s": round(min(persists), 3),
              "serialise_for_peer_s": round(min(serial), 3),
              "stall_GBps": round(total / min(stalls) / 1e9, 2)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
