"""Checkpoints of states with many tensors: stoker.Checkpointer / load_latest
beside torch.save / torch.load of the same state, in the same run.

A state shaped as a training loop saves it: {"model": {name: param},
"optimizer": {"state": {i: {"exp_avg", "exp_avg_sq", "step"}}, "param_groups":
[...]}} (torch's Adam), with the same total bytes whatever the count, so
that only the per-tensor costs change. For each tensor count:
  - torch.save: the call (the training loop's stall), median of five calls
    in a row as a loop makes them, and the fsync that then makes it durable;
  - torch.load: median of three loads of that file (from the page cache);
  - stoker: the stall of save() (median of the saves after the first, which
    allocates the snapshot buffer), the time until that checkpoint is durable
    and published, and load_latest() (every checksum verified, the nested
    state rebuilt), median of three, from the page cache.

    PYTHONPATH=build/release/python .venv/bin/python bench/checkpoint_many_tensors.py \
        --tensors 20,2000,20000,60000 --size 256MiB
    # GPU check (GPU_CHECK_PARTS=checkpoint): the state in GPU memory
    ... bench/checkpoint_many_tensors.py --tensors 20000,60000 --device cuda --saves 5
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import time

import torch

import stoker
from stoker.checkpoint import parse_size

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_bench import drop_page_cache  # noqa: E402


def make_state(tensors, total_bytes, device="cpu"):
    """About `tensors` tensors (4 per parameter: the parameter, two Adam
    moments, a step) holding about `total_bytes` of float32, on `device`."""
    params = max(1, tensors // 4)
    per = max(1, total_bytes // (3 * 4 * params))
    gen = torch.Generator().manual_seed(0)

    def made(t):
        return t.to(device)

    model = {"layers.%d.weight" % i: made(torch.randn(per, generator=gen)) for i in range(params)}
    optimizer = {
        "state": {i: {"step": made(torch.tensor(float(i))), "exp_avg": made(torch.randn(per, generator=gen)),
                      "exp_avg_sq": made(torch.rand(per, generator=gen))} for i in range(params)},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
                          "params": list(range(params))}],
    }
    return {"model": model, "optimizer": optimizer}


def count_tensors(state):
    if torch.is_tensor(state):
        return 1
    if isinstance(state, dict):
        return sum(count_tensors(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(count_tensors(v) for v in state)
    return 0


def median_time(fn, runs=3):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def bench_count(tensors, total_bytes, directory, saves, device="cpu"):
    state = make_state(tensors, total_bytes, device)
    out = {"tensors": count_tensors(state),
           "state_bytes": sum(t.numel() * t.element_size() for t in
                              list(state["model"].values()) +
                              [v for s in state["optimizer"]["state"].values() for v in s.values()])}
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)

    # torch.save as a training loop calls it: one save after another.
    drop_page_cache()
    paths = [os.path.join(directory, "torch-%d.pt" % i) for i in range(5)]
    saves_torch = []
    for path in paths:
        start = time.perf_counter()
        torch.save(state, path)
        saves_torch.append(time.perf_counter() - start)
    start = time.perf_counter()
    fd = os.open(paths[-1], os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    out["torch_save_fsync_s"] = time.perf_counter() - start
    out["torch_save_s"] = statistics.median(saves_torch)
    out["torch_save_runs_s"] = saves_torch
    # Into host memory, as stoker's load gives it (zero-copy views of the files).
    out["torch_load_s"], out["torch_load_runs_s"] = median_time(lambda: torch.load(paths[-1], map_location="cpu"))
    for path in paths:
        os.remove(path)

    drop_page_cache()
    stalls, durable = [], []
    ckpt_dir = os.path.join(directory, "stoker")
    with stoker.Checkpointer(ckpt_dir, keep_last=1) as ckpt:
        for i in range(saves + 1):
            start = time.perf_counter()
            ckpt.save(i, state, rng=False)
            stall = time.perf_counter() - start
            ckpt.wait()  # training would go on here; each save is measured alone
            done = time.perf_counter() - start
            if i == 0:
                out["stoker_first_stall_s"] = stall
            else:
                stalls.append(stall)
                durable.append(done)
    out["stoker_stall_s"] = statistics.median(stalls)
    out["stoker_stall_runs_s"] = stalls
    out["stoker_durable_s"] = statistics.median(durable)
    loaded = stoker.load_latest(ckpt_dir)
    assert loaded is not None and torch.equal(loaded.state["optimizer"]["state"][0]["exp_avg"],
                                              state["optimizer"]["state"][0]["exp_avg"].cpu())
    del loaded
    out["stoker_load_s"], out["stoker_load_runs_s"] = median_time(lambda: stoker.load_latest(ckpt_dir))
    out["stall_vs_torch_save"] = out["stoker_stall_s"] / out["torch_save_s"]
    out["load_vs_torch_load"] = out["stoker_load_s"] / out["torch_load_s"]
    shutil.rmtree(directory, ignore_errors=True)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", default="20,2000,20000,60000", help="tensor counts, comma-separated")
    parser.add_argument("--size", default="256MiB", help="bytes of tensor data in every state")
    parser.add_argument("--dir", default="/var/tmp/stoker-many-tensors-bench")
    parser.add_argument("--saves", type=int, default=10, help="steady-state saves per count (after the first)")
    parser.add_argument("--device", default="cpu", help="where the state lives (cuda: the GPU check)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    print("| tensors | torch.save | stoker stall | stall / torch.save | durable after | torch.load | stoker load | "
          "load / torch.load |")
    print("|---|---|---|---|---|---|---|---|")
    for count in args.tensors.split(","):
        r = bench_count(int(count), parse_size(args.size), args.dir, args.saves, args.device)
        r["device"] = args.device
        results.append(r)
        print("| %s | %.3f s | %.3f s (first %.3f s) | %.1f%% | %.2f s | %.3f s | %.3f s | %.2fx |"
              % (format(r["tensors"], ","), r["torch_save_s"], r["stoker_stall_s"], r["stoker_first_stall_s"],
                 100 * r["stall_vs_torch_save"], r["stoker_durable_s"], r["torch_load_s"], r["stoker_load_s"],
                 r["load_vs_torch_load"]), flush=True)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
