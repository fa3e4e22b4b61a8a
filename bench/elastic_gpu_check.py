#!/usr/bin/env python3
"""Elastic training on a GPU (part "elastic_nccl" of scripts/gpu-check):

1. stoker.elastic.run() under the torchrun path in a program that made its
   default group with NCCL first (one GPU: world size 1): the runner's host
   tensors go through a gloo group beside it, so the run trains through
   instead of restarting (before: NCCL was handed CPU tensors, 100 restarts).
2. stoker.elastic.Trainer with the model on the GPU under float16 autocast
   and torch's GradScaler (--amp; in the dry run only on torch >= 2.3, whose
   scaler runs on the CPU: torch 1.13's needs CUDA), 2 ranks on gloo (CUDA tensors through the host; NCCL
   refuses two ranks on one GPU), one SIGKILLed mid-run: each sample once,
   replicas' parameters and loss scales equal, StepLR on schedule.
3. The in-process mode's own NCCL group for DDP (one rank, one GPU), aborted
   at step 3 by the armed watch's fault hook as if a member were gone: the
   step fails, the next generation makes a new NCCL group, each sample once
   (dry run: 2 ranks over a gloo device group, no fault).

    PYTHONPATH=build/gpu/python python3 bench/elastic_gpu_check.py --json OUT.json
    PYTHONPATH=build/release/python .venv/bin/python bench/elastic_gpu_check.py --dry-run   # CPU, gloo
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUN_SCRIPT = r"""
import json, os, sys, torch, torch.distributed as dist, stoker, stoker.elastic, stoker.transforms as T
backend, device, data, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group(backend)  # the program's own group, made before run()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = stoker.Loader(data, global_batch_size=16, with_indices=True, num_threads=1, log_epochs=False,
                       transform=T.Compose([T.Resize(16), T.CenterCrop(16)]))
summary = stoker.elastic.run(lambda x, y: torch.nn.functional.cross_entropy(model(x.to(device)), y.to(device) % 10),
                             model=model, optimizer=opt, loader=loader, epochs=2)
with open(out, "w") as f:
    json.dump({"steps": summary.steps, "restarts": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
               "backend": dist.get_backend()}, f)
"""


def _cpu_scaler():
    import torch
    return hasattr(getattr(torch, "amp", None), "GradScaler")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU and gloo: check the plumbing without a GPU")
    ap.add_argument("--json")
    args = ap.parse_args()
    device, backend = ("cpu", "gloo") if args.dry_run else ("cuda", "nccl")
    work = tempfile.mkdtemp(prefix="stoker-elastic-gpu-")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), os.path.join(work, "img"),
                    "--classes", "4", "--per-class", "25", "--jobs", "2"], check=True, capture_output=True)
    import stoker
    data = os.path.join(work, "packed")
    stoker.pack(os.path.join(work, "img"), data)
    results = {"device": device}

    # 1. run() with the program's NCCL group.
    script = os.path.join(work, "run_nccl.py")
    with open(script, "w") as f:
        f.write(RUN_SCRIPT)
    out = os.path.join(work, "run.json")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", "--standalone", "--nproc-per-node", "1",
                        "--max-restarts", "2", script, backend, device, data, out], capture_output=True, text=True,
                       timeout=300)
    got = json.load(open(out)) if os.path.exists(out) else None
    results["run_with_program_group"] = {"ok": r.returncode == 0 and got is not None and got["steps"] == 14 and
                                         got["restarts"] == 0, "result": got, "seconds": time.monotonic() - t0,
                                         "tail": None if r.returncode == 0 else (r.stdout + r.stderr)[-2000:]}
    print("run() with the program's %s group: %s" % (backend, results["run_with_program_group"]), flush=True)

    # 2. Trainer, model on the device, 2 ranks on gloo, one killed.
    log = os.path.join(work, "ddp.jsonl")
    port = free_port()
    example = os.path.join(ROOT, "examples", "elastic_ddp.py")
    t0 = time.monotonic()
    main_proc = subprocess.Popen([sys.executable, "-m", "stoker.elastic.launch", "--in-process", "--rdzv-endpoint",
                                  "127.0.0.1:%d" % port, "--nproc-per-node", "2", "--min-workers", "1",
                                  "--max-workers", "2", example, "--data", data, "--epochs", "2", "--log", log,
                                  "--device", device, "--step-delay", "0.2", "--timeout", "10"] +
                                 (["--amp"] if not args.dry_run or _cpu_scaler() else []),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while (not os.path.exists(log) or sum(1 for _ in open(log)) < 6) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = subprocess.run(["pgrep", "-P", str(main_proc.pid)], capture_output=True, text=True).stdout.split()
    victims = sorted(int(p) for p in pids if b"elastic_ddp.py" in open("/proc/%s/cmdline" % p, "rb").read())
    if victims:
        os.kill(victims[-1], signal.SIGKILL)
    try:
        output, _ = main_proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(main_proc.pid, signal.SIGKILL)
        output, _ = main_proc.communicate()
    check = subprocess.run([sys.executable, example, "--check", log, "--data", data, "--epochs", "2"],
                           capture_output=True, text=True)
    results["trainer_on_device"] = {"ok": main_proc.returncode == 0 and check.returncode == 0 and bool(victims),
                                    "check": check.stdout.strip(), "seconds": time.monotonic() - t0,
                                    "tail": None if main_proc.returncode == 0 else output[-2000:]}
    print("Trainer, model on %s, 2 ranks, one killed: %s" % (device, results["trainer_on_device"]), flush=True)

    # 3. The in-process mode's own device group, made per generation: on the GPU, NCCL with one rank
    # (NCCL refuses two ranks on one GPU), aborted from the armed watch at step 3 as if a member were
    # gone; the step fails, the next generation forms a new NCCL group and training goes on, each sample
    # once. The dry run: 2 ranks over a gloo device group, no fault (gloo's groups cannot be aborted).
    log = os.path.join(work, "device_group.jsonl")
    port = free_port()
    env = dict(os.environ, STOKER_ELASTIC_DEVICE_BACKEND="gloo" if args.dry_run else "nccl")
    if not args.dry_run:
        env["STOKER_ELASTIC_TEST_ABORT_AT_STEP"] = "3"
    ranks = 2 if args.dry_run else 1
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", "--in-process", "--rdzv-endpoint",
                        "127.0.0.1:%d" % port, "--nproc-per-node", str(ranks), "--min-workers", "1",
                        "--max-workers", str(ranks), example, "--data", data, "--epochs", "2", "--log", log,
                        "--device", device, "--timeout", "10"], capture_output=True, text=True, env=env, timeout=300)
    output = r.stdout + r.stderr
    check = subprocess.run([sys.executable, example, "--check", log, "--data", data, "--epochs", "2"],
                           capture_output=True, text=True)
    backend_name = env["STOKER_ELASTIC_DEVICE_BACKEND"]
    groups = output.count("(device group: %s)" % backend_name)
    aborted = "aborting the device group" in output
    ok = r.returncode == 0 and check.returncode == 0 and groups >= 1 and (args.dry_run or (aborted and groups >= 2))
    results["device_group_abort_reform"] = {"ok": ok, "backend": backend_name, "ranks": ranks,
                                            "groups_formed": groups, "aborted": aborted,
                                            "check": check.stdout.strip(), "seconds": time.monotonic() - t0,
                                            "tail": None if ok else output[-3000:]}
    print("in-process device group (%s, %d rank(s))%s: %s" % (
        backend_name, ranks, "" if args.dry_run else ", aborted at step 3", results["device_group_abort_reform"]),
        flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0 if all(v["ok"] for k, v in results.items() if isinstance(v, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
