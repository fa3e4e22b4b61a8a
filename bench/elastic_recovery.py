#!/usr/bin/env python3
"""Recovery after SIGKILL of one of N workers: stoker's in-process mode (run()
and, with the program's own DDP loop, stoker.elastic.Trainer: cases
trainer_in_process and trainer_torchrun, examples/elastic_ddp.py),
stoker's torchrun path (tuned launcher, in-memory snapshots), plain
torchrun with its defaults (resuming from the last checkpoint on disk), and
the peer without stoker at all (case plain_ddp_torchrun: the same DDP loop
written for torchrun with torch.save checkpoints, bench/plain_ddp.py), and
torchft (case torchft: the same loop on torchft 0.2, one replica group per
torchrun and a lighthouse, bench/torchft_ddp.py; needs torch >= 2.7 and
torchft in the Python that runs this, e.g. a scratch venv:
`python3 -m venv V; V/bin/pip install torch==2.7.1 torchvision==0.22.1
torchft==0.2.0 "numpy<2"`).

    PYTHONPATH=build/release/python .venv/bin/python bench/elastic_recovery.py [--workers 3] [--repeats 3]

Each run trains examples/elastic_train.py (a small CNN on demo images, gloo
on the CPU) with a fixed step time (--step-delay), kills a worker (or a
whole node: agent and worker) after a few committed steps, and reads the
step log: recovery = time from the kill to the next committed step, less
one normal step; back at = time from the kill until a step past the last
one committed before it commits, less one step (recovery plus the work
redone); steps recomputed = steps committed before the kill that were
committed again; and the log is checked for every sample exactly once
per epoch (a resumed run's repeated steps are work lost, not samples
trained twice: the log keeps the last commit of each step).
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_train.py")
DDP_EXAMPLE = os.path.join(ROOT, "examples", "elastic_ddp.py")  # the program's own DDP loop: stoker.elastic.Trainer
PLAIN_DDP = os.path.join(ROOT, "bench", "plain_ddp.py")  # the same loop without stoker: torch.save, torchrun
TORCHFT_DDP = os.path.join(ROOT, "bench", "torchft_ddp.py")  # the same loop on torchft


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_log(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                out.append(rec)
    except FileNotFoundError:
        pass
    return out


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    pids = []
    for p in out:
        try:
            with open("/proc/%s/cmdline" % p, "rb") as f:
                cmdline = f.read()
                if any(s in cmdline for s in (b"elastic_train.py", b"elastic_ddp.py", b"plain_ddp.py",
                                              b"torchft_ddp.py")):
                    pids.append(int(p))
        except FileNotFoundError:
            pass
    return sorted(pids)


class Timed:
    """Watches the step log, stamping when each line appears."""

    def __init__(self, path):
        self.path, self.seen, self.stamps = path, 0, []

    def poll(self):
        lines = read_log(self.path)
        now = time.monotonic()
        for rec in lines[self.seen:]:
            self.stamps.append((now, rec))
        self.seen = len(lines)
        return lines


def start_torchft(cmd, env, replicas, lighthouse_args):
    """A lighthouse, then one torchrun per replica group (each restarts its own worker), as torchft's README
    runs its train_ddp.py example. Returns (the torchruns, the lighthouse)."""
    port = free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "torchft_lighthouse")
    lighthouse = subprocess.Popen([exe, "--bind", "[::]:%d" % port, "--min_replicas", "1"] + lighthouse_args,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    procs = []
    for r in range(replicas):
        renv = dict(env, TORCHFT_LIGHTHOUSE="http://localhost:%d" % port, REPLICA_GROUP_ID=str(r),
                    NUM_REPLICA_GROUPS=str(replicas))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
             "--max-restarts", "3", "--"] + cmd, env=renv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
    return procs, lighthouse


def run_case(name, launch_args, example_extra, data, workdir, kill, env_extra, step_delay, kill_after=4,
             agents=1, example=EXAMPLE, lighthouse_args=None):
    log = os.path.join(workdir, name + ".jsonl")
    if os.path.exists(log):
        os.remove(log)
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH"), os.path.join(ROOT, "examples")] if p)
    images = example in (PLAIN_DDP, TORCHFT_DDP)  # the peers read the unpacked images
    source = os.path.join(os.path.dirname(data), "img") if images else data
    program = [example, "--images" if images else "--data", source, "--epochs", "3", "--global-batch", "16",
               "--log", log, "--step-delay", str(step_delay), "--timeout", "10"] + example_extra
    cmd = [sys.executable, "-m", "stoker.elastic.launch"] + launch_args + program
    per_step = example == EXAMPLE  # the DDP example logs a line per step and rank
    procs, lighthouse = [], None
    if example == TORCHFT_DDP:
        procs, lighthouse = start_torchft(program, env, agents, lighthouse_args or [])
        agents = len(procs)
    for i in range(0 if lighthouse else agents):
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      start_new_session=True))
        if i == 0 and agents > 1:
            time.sleep(1.5)  # the first agent hosts the c10d store
    watch = Timed(log)
    deadline = time.monotonic() + 300
    while len({r["step"] for r in watch.poll()}) < kill_after:
        if time.monotonic() > deadline or procs[0].poll() is not None:
            raise RuntimeError("%s: never reached step %d" % (name, kill_after))
        time.sleep(0.01)
    time.sleep(step_delay / 2)  # mid-step
    before = watch.poll()
    last_before = max(r["step"] for r in before)
    if kill == "worker":
        victim = children(procs[-1 if lighthouse else 0].pid)[-1]
        os.kill(victim, signal.SIGKILL)
    else:  # a whole node: the last agent's process group
        os.killpg(procs[-1].pid, signal.SIGKILL)
        procs[-1].wait()  # reaped, as its parent (a shell, a kubelet) would
    killed_at = time.monotonic()
    first_after = None
    # Every rank logs its commits in the DDP example: a commit already under way when the kill came is no
    # recovery. Training goes on when the new group commits: a smaller world (in-process), or a process that
    # was not there before the kill (a restart).
    pids_before, world_before = {r.get("pid") for r in before}, max(r["world_size"] for r in before)

    def by_new_group(rec):
        if not rec.get("committed", True):
            return False  # torchft logs the steps whose commit failed too
        return per_step or rec["world_size"] != world_before or rec.get("pid") not in pids_before
    while any(p.poll() is None for p in procs[: agents - 1 if kill == "node" else agents]):
        watch.poll()
        if first_after is None:
            for t, rec in watch.stamps:
                if t > killed_at and by_new_group(rec):
                    first_after = (t, rec)
                    break
        if time.monotonic() > deadline:
            for p in procs:
                os.killpg(p.pid, signal.SIGKILL)
            raise RuntimeError("%s: did not finish" % name)
        time.sleep(0.01)
    for p in procs + ([lighthouse] if lighthouse else []):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    watch.poll()
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from elastic_train import check
    import stoker
    n = stoker._native.num_samples(data)
    if per_step:
        # A resumed run commits some steps again; the log keeps one line per commit, so check the last of each.
        dedup = {}
        for rec in read_log(log):
            dedup[rec["step"]] = rec
        clean = os.path.join(workdir, name + ".last.jsonl")
        with open(clean, "w") as f:
            for k in sorted(dedup):
                f.write(json.dumps(dedup[k]) + "\n")
        problems = check(clean, n, 3, 16)
    elif lighthouse:  # samples trained by a participating replica in a committed step, replicas equal, LR
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        from torchft_ddp import check as check_torchft
        problems = check_torchft(log, n, 3, 0.05)
    else:  # every rank's lines: samples once, replicas equal, the LR schedule (elastic_ddp.py --check)
        from elastic_ddp import check as check_ddp
        problems = check_ddp(log, n, 3, 16, 0.05)
    recomputed = len({rec["step"] for rec in read_log(log)[len(before):]
                      if rec["step"] <= last_before and rec.get("committed", True)})
    # Every worker training again (torchft: the restarted replica group participating in a committed step).
    rejoined = next((t for t, rec in watch.stamps if t > killed_at and rec.get("committed", True)
                     and rec.get("participating", True) and rec.get("pid") not in pids_before), None)
    if first_after is None:
        raise RuntimeError("%s: no step after the kill" % name)
    t_after, rec_after = first_after
    recovery = t_after - killed_at - step_delay
    # Back where it was: the first step past the last one committed before the kill.
    back = next((t for t, rec in watch.stamps if t > killed_at and rec["step"] > last_before and by_new_group(rec)),
                None)
    return {"case": name, "recovery_s": round(max(recovery, 0.0), 2),
            "back_s": None if back is None else round(max(back - killed_at - step_delay, 0.0), 2),
            "recomputed_steps": recomputed,
            "rejoined_s": None if rejoined is None else round(max(rejoined - killed_at - step_delay, 0.0), 2),
            "first_step_after": rec_after["step"], "world_after": rec_after["world_size"],
            "exactly_once": not problems, "problems": problems}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--step-delay", type=float, default=0.3)
    ap.add_argument("--cases", default="in_process,stoker_torchrun,stoker_torchrun_node,torchrun_defaults,"
                                       "torchrun_defaults_node")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="stoker-elastic-bench-")
    data = os.path.join(work, "packed")
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "make_demo_data.py"), os.path.join(work, "img"),
                    "--classes", "4", "--per-class", "25", "--jobs", "2"], check=True, capture_output=True)
    import stoker
    stoker.pack(os.path.join(work, "img"), data)
    n = args.workers
    tuned_env = {}
    default_env = {"STOKER_RDZV_KEEP_ALIVE_S": "5"}  # torch's own keep-alive (3 x 5 s)
    defaults = ["--monitor-interval", "5", "--max-restarts", "3", "--rdzv-conf",
                "last_call_timeout=30,join_timeout=600,close_timeout=30"]
    ckpt = lambda name: ["--checkpoint-dir", os.path.join(work, name + "-ckpt"), "--checkpoint-every", "10",
                         "--snapshot-copies", "0"]
    cases = {
        "trainer_in_process": lambda port: dict(
            launch_args=["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", str(n),
                         "--min-workers", "1", "--max-workers", str(n)], example_extra=[], kill="worker",
            env_extra=tuned_env, example=DDP_EXAMPLE),
        "trainer_torchrun": lambda port: dict(
            launch_args=["--standalone", "--nproc-per-node", str(n)], example_extra=[], kill="worker",
            env_extra=tuned_env, example=DDP_EXAMPLE),
        "in_process": lambda port: dict(
            launch_args=["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", str(n),
                         "--min-workers", "1", "--max-workers", str(n)], example_extra=[], kill="worker",
            env_extra=tuned_env),
        "stoker_torchrun": lambda port: dict(
            launch_args=["--standalone", "--nproc-per-node", str(n)], example_extra=[], kill="worker",
            env_extra=tuned_env),
        "stoker_torchrun_node": lambda port: dict(
            launch_args=["--nnodes", "%d:%d" % (n - 1, n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", "b%d" % port], example_extra=[],
            kill="node", env_extra=tuned_env, agents=n),
        # The peer: the same DDP loop without stoker (torchvision, DistributedSampler, torch.save every 10
        # steps), restarted by torchrun with its defaults (through stoker's launcher only for Debian's torch
        # 1.13 on Python 3.11).
        "plain_ddp_torchrun": lambda port: dict(
            launch_args=["--standalone", "--nproc-per-node", str(n)] + defaults,
            example_extra=["--checkpoint", os.path.join(work, "plain%d.pt" % port), "--checkpoint-every", "10"],
            kill="worker", env_extra=default_env, example=PLAIN_DDP, kill_after=14),
        # The peer for the replica dimension: torchft, the lighthouse as its README starts it (a quorum every
        # 100 ms, stragglers waited for 10 s, a silent replica dead after 5 s), then with 1 s heartbeats.
        "torchft": lambda port: dict(
            launch_args=[], example_extra=["--start-barrier", os.path.join(work, "ft%d" % port)], kill="worker",
            env_extra=default_env, example=TORCHFT_DDP, agents=n,
            lighthouse_args=["--quorum_tick_ms", "100", "--join_timeout_ms", "10000"]),
        "torchft_fast": lambda port: dict(
            launch_args=[], example_extra=["--start-barrier", os.path.join(work, "ftf%d" % port)], kill="worker",
            env_extra=default_env, example=TORCHFT_DDP, agents=n,
            lighthouse_args=["--quorum_tick_ms", "100", "--join_timeout_ms", "10000", "--heartbeat_timeout_ms",
                             "1000"]),
        "torchrun_defaults": lambda port: dict(
            launch_args=["--standalone", "--nproc-per-node", str(n)] + defaults, example_extra=ckpt("d%d" % port),
            kill="worker", env_extra=default_env),
        "torchrun_defaults_node": lambda port: dict(
            launch_args=["--nnodes", "%d:%d" % (n - 1, n), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                         "--rdzv-endpoint", "127.0.0.1:%d" % port, "--rdzv-id", "d%d" % port] + defaults,
            example_extra=ckpt("dn%d" % port), kill="node", env_extra=default_env, agents=n),
    }
    results = []
    for name in args.cases.split(","):
        runs = []
        for r in range(args.repeats):
            port = free_port()
            spec = dict(kill_after=9)
            spec.update(cases[name](port))
            res = run_case(name, data=data, workdir=work, step_delay=args.step_delay, **spec)
            runs.append(res)
            print(json.dumps(res), flush=True)
        results.append({"case": name, "median_recovery_s": statistics.median(x["recovery_s"] for x in runs),
                        "median_back_s": statistics.median(x["back_s"] for x in runs),
                        "recoveries_s": [x["recovery_s"] for x in runs],
                        "recomputed_steps": [x["recomputed_steps"] for x in runs],
                        "rejoined_s": [x["rejoined_s"] for x in runs],
                        "exactly_once": all(x["exactly_once"] for x in runs),
                        "problems": sorted({p for x in runs for p in x["problems"]})})
    print("\n%-24s %10s %12s  %-22s %-16s %-20s %s" % ("case", "median s", "back at s", "recoveries s",
                                                       "steps recomputed", "all workers again s", "each sample once"))
    for r in results:
        print("%-24s %10.2f %12.2f  %-22s %-16s %-20s %s" % (
            r["case"], r["median_recovery_s"], r["median_back_s"], ",".join("%.2f" % x for x in r["recoveries_s"]),
            ",".join(map(str, r["recomputed_steps"])),
            ",".join("-" if x is None else "%.2f" % x for x in r["rejoined_s"]), r["exactly_once"]))
        for p in r["problems"][:6]:
            print("    " + p)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
