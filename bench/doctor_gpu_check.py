"""The doctor on a real GPU (part "doctor" of scripts/gpu-check): ResNet-50
(bf16 autocast, channels_last) and a launch-bound small model (a stack of
tiny linear layers), each with planted stalls: a data loader slowed by
20 ms a batch, a synchronous 200 ms checkpoint every 10 steps, .item() each
step, and pageable host-to-device copies; then an unchanged ResNet-50
program calling .item() each step under `python -m stoker.doctor` (the
hooks, not the API). For each run: the doctor's
account (GPU compute and idle by cause), the host's view, NVML utilisation
beside it, and the verdict's first finding.

    PYTHONPATH=build/gpu/python python3 bench/doctor_gpu_check.py --json OUT.json
"""
import argparse
import json
import os
import tempfile
import time

import torch
import torchvision

from stoker.doctor import Doctor


def make(model_name):
    torch.manual_seed(0)
    if model_name == "resnet50":
        model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
        x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device="cuda")
    else:  # launch-bound: many tiny kernels per step
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(48)]).cuda()
        x = torch.randn(32, 64, device="cuda")
        y = torch.randint(0, 64, (32,), device="cuda")
    return model, torch.optim.SGD(model.parameters(), lr=0.01), x, y


def batches(x, y, steps, delay, pageable):
    host = x.cpu() if pageable else None
    for _ in range(steps):
        if delay:
            time.sleep(delay)
        yield (host if pageable else x), y


def run(model_name, stall, steps):
    model, opt, x, y = make(model_name)
    for _ in range(3):  # warm-up (cudnn autotuning, allocations)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    path = os.path.join(tempfile.gettempdir(), "stoker-doctor-check.pt")
    doc = Doctor(cuda=True)
    planted = {"data_delay_s": 0.020 if stall == "slow loader" else 0.0}
    for step, (bx, by) in enumerate(doc.batches(batches(x, y, steps, planted["data_delay_s"],
                                                        stall == "pageable copies"))):
        if stall == "pageable copies":
            with doc.phase("h2d_copy"):
                bx = bx.to("cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(bx), by)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if stall == "item each step":
            with doc.phase("sync"):
                loss.item()
        if stall == "sync checkpoint" and step % 10 == 9:
            with doc.phase("checkpoint"):
                torch.save(model.state_dict(), path)
                time.sleep(0.2)
    doc.close()
    account = doc.account()
    verdict = doc.verdict()
    result = {"model": model_name, "stall": stall, "steps": account["steps"],
              "step_ms": 1000 * account["wall_s"] / max(account["steps"], 1),
              "share": {k: round(v, 4) for k, v in account["share"].items() if v > 0},
              "host_seconds": {k: round(v, 4) for k, v in account["host_seconds"].items() if v > 0},
              "nvml_utilization": account["nvml_utilization"], "verdict": verdict[0][0] if verdict else "compute-bound",
              "cannot_see": doc.cannot_see}
    print("%-10s %-16s step %6.1f ms  %s  NVML %s  -> %s" % (
        model_name, stall, result["step_ms"], " ".join("%s %.0f%%" % (k, 100 * v) for k, v in result["share"].items()),
        "n/a" if result["nvml_utilization"] is None else "%.0f%%" % result["nvml_utilization"], result["verdict"]),
        flush=True)
    return result


HOOKED = """
import sys, torch, torchvision
torch.backends.cudnn.benchmark = True
model = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x = torch.randn(128, 3, 224, 224).to(memory_format=torch.channels_last).pin_memory()
y = torch.randint(0, 1000, (128,))
for bx, by in torch.utils.data.DataLoader([(x, y)] * int(sys.argv[1]), batch_size=None, pin_memory=True):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(bx.cuda(non_blocking=True)), by.cuda(non_blocking=True))
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    print(loss.item())  # the planted host sync, seen only through the hooks
"""


def run_hooked(steps):
    """An unchanged program under `python -m stoker.doctor`: .item() each step must be named through the hooks."""
    import subprocess
    import sys
    folder = tempfile.mkdtemp(prefix="stoker-doctor-hooked-")
    script = os.path.join(folder, "train.py")
    with open(script, "w") as f:
        f.write(HOOKED)
    run = subprocess.run([sys.executable, "-m", "stoker.doctor", "--out", folder, "--", sys.executable, script,
                          str(steps)], capture_output=True, text=True, timeout=300)
    reports = [f for f in os.listdir(folder) if f.startswith("rank-")]
    if run.returncode != 0 or not reports:
        return {"model": "resnet50", "stall": "hooked item", "error": run.stderr[-2000:]}
    with open(os.path.join(folder, reports[0])) as f:
        r = json.load(f)
    result = {"model": "resnet50", "stall": "hooked item", "steps": r["account"]["steps"],
              "step_ms": 1000 * r["account"]["wall_s"] / max(r["account"]["steps"], 1),
              "share": {k: round(v, 4) for k, v in r["account"]["share"].items() if v > 0},
              "host_seconds": {k: round(v, 4) for k, v in r["account"]["host_seconds"].items() if v > 0},
              "nvml_utilization": r["account"]["nvml_utilization"],
              "verdict": r["verdict"][0]["finding"] if r["verdict"] else "compute-bound"}
    print("%-10s %-16s step %6.1f ms  host %s  -> %s" % ("resnet50", "hooked item", result["step_ms"],
                                                         result["host_seconds"], result["verdict"]), flush=True)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("doctor_gpu_check: no CUDA device")
    torch.backends.cudnn.benchmark = True
    results = []
    for model_name in ("resnet50", "tiny-mlp"):
        for stall in ("none", "slow loader", "sync checkpoint", "item each step", "pageable copies"):
            results.append(run(model_name, stall, args.steps))
    results.append(run_hooked(args.steps))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
