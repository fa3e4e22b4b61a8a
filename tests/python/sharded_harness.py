"""Starts the ranks of sharded_ckpt_job.py as separate processes on gloo, as
torchrun would, and collects what each reports."""
import json
import os
import pathlib
import socket
import subprocess
import sys
import time

JOB = pathlib.Path(__file__).with_name("sharded_ckpt_job.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(world, mode, directory, *args, results):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), RESULT_DIR=str(results), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(JOB), mode, str(directory), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def run(world, mode, directory, *args, results, timeout=120):
    """Runs the job to its end; returns each rank's result (and its output as "output")."""
    results.mkdir(exist_ok=True)
    procs = start(world, mode, directory, *args, results=results)
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outputs.append(out.decode(errors="replace"))
    for rank, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, "rank %d of %s failed:\n%s" % (rank, mode, out)
    loaded = [json.loads((results / ("result-%d.json" % r)).read_text()) for r in range(world)]
    for result, out in zip(loaded, outputs):
        result["output"] = out
    return loaded


def published_since(ckpt, step):
    """Whether a step-N folder with N >= step is there (retention may have removed step-`step` already)."""
    try:
        names = [p.name for p in ckpt.iterdir()]
    except FileNotFoundError:
        return False
    return any(n.startswith("step-") and n[5:].isdigit() and int(n[5:]) >= step for n in names)


def stop_after_kill(procs, rng):
    """After one rank was SIGKILLed: a moment (up to 0.2 s) for the others to notice, then the rest go too."""
    time.sleep(rng.uniform(0, 0.2))
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.communicate()
