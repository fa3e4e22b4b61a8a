"""GPU sharing on a real GPU (scripts/gpu-check's "share" part).

Runs, each in processes of its own under `stoker gpu run`:
  resolve    every hook reached by name, dlsym and cuGetProcAddress (share_probe)
  property   random operations over the driver API, the ledger against NVML's
             per-process view after each (share_probe)
  accounting the share probe's scenarios for arrays (sized by a deferred
             twin; sparse tiles holding their handles), pools (admitted for
             their growth) and graphs (admitted before launch): the ledger's
             charge beside NVML's per-process figure on the real driver
  fill       PyTorch filling a 20 GiB quota (default allocator,
             expandable_segments, cudaMallocAsync): where the OOM comes, what
             torch.cuda.mem_get_info() says, ledger vs driver while filling
  graph      CUDA graph capture and replay under the quota
  pair       two processes at 40 and 60 GiB filling at once: the device's use
             sampled by NVML never passes 100 GiB
  nccl       NCCL, world size 1, an all-reduce under the quota
  overhead   ResNet-50 bf16 training steps with and without the interposer
  compute    two tenants at 30% and 70%: the throughput each gets
  compute_agent  the same through `stoker gpu agent`'s turns broker (the
             node's schedule kept by the agent, asked over its socket; on
             the fake driver, the probe's 1 ms kernels)
  compute_noshare  a tenant at 70% beside a job with a memory quota only,
             through the agent: the job without a share takes turns for
             the 30% the share leaves (before, it launched over the 70%
             tenant's turns)
  graph_shared  CUDA graphs captured (20 times) and replayed by a tenant at 30%
             while a 70% tenant computes: the compute turns end and start
             during the captures, which must stay valid and replay right
  place      two jobs placed by memory (30 and 50 GiB) on the card, each held to
             its quota; a third that does not fit beside them refused; the
             time `stoker gpu run` adds before the command starts

    gpu_share_check.py --stoker build/gpu/stoker --probe build/gpu/fake-gpu/probe/share_probe \
        --json OUT/share.json [--parts fill,compute] [--fake build/fake-gpu]

--fake runs the probe parts on the fake driver (a dry run without a GPU);
the PyTorch parts then report "skipped: no CUDA device"."""
import argparse
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

GiB = 1 << 30
MiB = 1 << 20
PARTS = ["resolve", "property", "accounting", "fill", "graph", "pair", "nccl", "overhead", "compute", "compute_agent",
         "compute_noshare", "graph_shared", "place"]


def run(cmd, env=None, timeout=300):
    started = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    return r, time.time() - started


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        at = line.find("{")
        if at >= 0:
            try:
                return json.loads(line[at:])
            except ValueError:
                continue
    return None


class Check:
    def __init__(self, args):
        self.args = args
        self.results = {}
        self.env = dict(os.environ)
        self.ledger = "/dev/shm/stoker-gpu-check-ledger-%d" % os.getpid()
        self.env["STOKER_GPU_LEDGER"] = self.ledger
        self.leases = "/dev/shm/stoker-gpu-check-leases-%d.json" % os.getpid()
        self.env["STOKER_GPU_LEASES"] = self.leases
        if args.fake:
            self.env["LD_LIBRARY_PATH"] = "%s/cuda-current:%s/nvml:%s/probe" % (args.fake, args.fake, args.fake)
            self.env["FAKE_GPU_STATE"] = "/dev/shm/stoker-gpu-check-fake-%d" % os.getpid()
        else:  # the probe's two small libraries (the RTLD_NEXT check); the driver is the machine's
            probe_dir = os.path.dirname(os.path.abspath(args.probe))
            self.env["LD_LIBRARY_PATH"] = probe_dir + (":" + os.environ["LD_LIBRARY_PATH"]
                                                       if os.environ.get("LD_LIBRARY_PATH") else "")
        try:
            import torch
            self.cuda = torch.cuda.is_available() and not args.fake
        except ImportError:
            self.cuda = False

    def gpu_run(self, limits, command, extra_env=None, timeout=300, place=False):
        # The interposer's parts run where the GPU is (--no-place); the place part lets stoker choose.
        env = dict(self.env, **(extra_env or {}))
        return run([self.args.stoker, "gpu", "run", "--quiet", *([] if place else ["--no-place"]), *limits, "--",
                    *command], env=env, timeout=timeout)

    def python(self, limits, code, extra_env=None, timeout=300, place=False):
        r, seconds = self.gpu_run(limits, [sys.executable, "-c", textwrap.dedent(code)], extra_env, timeout, place)
        return r, seconds, last_json(r.stdout)

    # --- the probe's parts ---------------------------------------------------

    def resolve(self):
        r, s = self.gpu_run(["--memory", "100GiB"], [self.args.probe, "resolve"])
        return {"ok": r.returncode == 0, "output": (r.stdout + r.stderr).strip()[-400:], "seconds": round(s, 1)}

    def property(self):
        env = {"PROBE_TOLERANCE_BYTES": str(64 * MiB)}
        r, s = self.gpu_run(["--memory", "40GiB"], [self.args.probe, "property", "--ops", "3000", "--seed", "7"], env,
                            timeout=400)
        out = last_json(r.stdout) or {}
        return dict(out, ok=r.returncode == 0, seconds=round(s, 1), output=(r.stdout + r.stderr).strip()[-300:])

    def accounting(self):
        # The quotas below are on top of what a context takes on this driver.
        r, _ = self.gpu_run(["--memory", "8GiB"], [self.args.probe, "alloc", "--bytes", str(MiB)], timeout=120)
        context = max(0, (last_json(r.stdout) or {}).get("process", MiB) - MiB)
        out = {"context_bytes": context}
        ok = r.returncode == 0
        for name, limit, command in (("arrays", 8 * GiB, ["arrays"]), ("pool_20MiB", 20 * MiB, ["pool"]),
                                     ("pool_40MiB", 40 * MiB, ["pool"]),
                                     ("pool_60MiB", 60 * MiB, ["pool"]),
                                     ("graph_over", 500 * MiB, ["graphs", "--over", str(600 * MiB)])):
            r, s = self.gpu_run(["--memory", str(context + limit)], [self.args.probe, *command], timeout=120)
            result = last_json(r.stdout) or {}
            out[name] = dict(result, exit=r.returncode, seconds=round(s, 1))
            if r.returncode != 0:
                out[name]["output"] = (r.stdout + r.stderr).strip()[-300:]
            ok = ok and r.returncode == 0
        # What a real driver says: the array charged as the driver sizes it,
        # the pool and the graph held to the quota.
        arrays = out["arrays"]
        ok = ok and arrays.get("sparse_charged") == 0 and arrays.get("end_charged") == 0
        ok = ok and out["graph_over"].get("over_result") == 2
        # Every pool run within its quota, the first growth too (measured
        # before it is admitted: a fresh pool's chunk on this driver).
        for name in ("pool_20MiB", "pool_40MiB", "pool_60MiB"):
            ok = ok and out[name].get("max_charged", 1 << 62) <= out[name].get("quota", 0)
        return dict(out, ok=ok)

    # --- PyTorch's parts ----------------------------------------------------

    FILL = """
        import json, os, subprocess, sys, torch
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        def driver_used():
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.pid == os.getpid():
                    return p.usedGpuMemory or 0
            return 0
        def ledger_used():
            view = json.loads(subprocess.run([sys.argv[1], "gpu", "ls", "--json"], capture_output=True,
                                             text=True).stdout)
            return sum(p["charged"][0] for t in view["tenants"] for p in t["processes"] if p["pid"] == os.getpid())
        free, total = torch.cuda.mem_get_info()
        held, worst, samples, step = [], 0, 0, 0
        oom_message = ""
        for chunk in (256 << 20, 16 << 20, 1 << 20):
            while True:
                try:
                    held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError as e:
                    oom_message = str(e).splitlines()[0]
                    break
                step += chunk
                if step >= (1 << 30):
                    step = 0
                    torch.cuda.synchronize()
                    d, l = driver_used(), ledger_used()
                    worst = max(worst, abs(d - l))
                    samples += 1
        torch.cuda.synchronize()
        d, l = driver_used(), ledger_used()
        print(json.dumps({"mem_get_info_total": total, "mem_get_info_free_at_start": free,
                          "allocated": sum(t.numel() for t in held), "driver_used_at_oom": d,
                          "ledger_at_oom": l, "worst_difference_while_filling": max(worst, abs(d - l)),
                          "samples": samples + 1, "oom": oom_message[:160]}))
    """

    def fill(self):
        quota = 20 * GiB
        out = {}
        for mode, conf in (("default", None), ("expandable_segments", "expandable_segments:True"),
                           ("cudaMallocAsync", "backend:cudaMallocAsync")):
            env = {"PYTORCH_CUDA_ALLOC_CONF": conf} if conf else {}
            r, s, j = self.python(["--memory", "20GiB"], self.FILL.replace("sys.argv[1]", repr(self.args.stoker)), env)
            if j is None:
                out[mode] = {"ok": False, "error": (r.stdout + r.stderr).strip()[-400:]}
                continue
            j["quota"] = quota
            j["oom_below_quota_by"] = quota - j["driver_used_at_oom"]
            tolerance = max(64 * MiB, j["driver_used_at_oom"] // 100)
            j["ok"] = (j["mem_get_info_total"] == quota and 0 <= j["oom_below_quota_by"] <= 64 * MiB
                       and j["worst_difference_while_filling"] <= tolerance and "out of memory" in j["oom"].lower())
            j["seconds"] = round(s, 1)
            out[mode] = j
        return out

    GRAPH = """
        import json, torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 4096)).cuda()
        x = torch.randn(512, 4096, device="cuda")
        eager = model(x).detach().clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = model(x)
        for _ in range(200):
            graph.replay()
        torch.cuda.synchronize()
        print(json.dumps({"replays": 200, "max_difference": float((y - eager).abs().max()),
                          "mem_get_info_total": torch.cuda.mem_get_info()[1]}))
    """

    def graph(self):
        r, s, j = self.python(["--memory", "20GiB"], self.GRAPH)
        if j is None:
            return {"ok": False, "error": (r.stdout + r.stderr).strip()[-400:]}
        return dict(j, ok=j["max_difference"] < 1e-3 and j["mem_get_info_total"] == 20 * GiB, seconds=round(s, 1))

    HOLD = """
        import json, os, time, torch
        free, total = torch.cuda.mem_get_info()
        held = []
        for chunk in (256 << 20, 16 << 20):
            while True:
                try:
                    held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
                except torch.OutOfMemoryError:
                    break
        torch.cuda.synchronize()
        time.sleep(4)
        print(json.dumps({"allocated": sum(t.numel() for t in held), "reported_total": total,
                          "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "lease": os.environ.get("STOKER_GPU_LEASE")}))
    """

    def pair(self):
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        base = pynvml.nvmlDeviceGetMemoryInfo(handle).used
        peak = [0]
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                peak[0] = max(peak[0], pynvml.nvmlDeviceGetMemoryInfo(handle).used - base)
                time.sleep(0.005)
        sampler = threading.Thread(target=sample)
        sampler.start()
        results = {}

        def one(name, quota):
            results[name] = self.python(["--memory", quota, "--tenant", name], self.HOLD)
        threads = [threading.Thread(target=one, args=("a40", "40GiB")), threading.Thread(target=one, args=("b60", "60GiB"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        sampler.join()
        allocated = {k: (v[2] or {}).get("allocated") for k, v in results.items()}
        return {"peak_device_use_above_idle": peak[0], "sum_of_quotas": 100 * GiB, "allocated": allocated,
                "ok": peak[0] <= 100 * GiB and all(allocated.values())}

    NCCL = """
        import json, os, socket, torch, torch.distributed as dist
        s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1)
        t = torch.full((64 << 20,), 2.0, device="cuda")
        dist.all_reduce(t)
        torch.cuda.synchronize()
        ok = bool((t == 2.0).all())
        dist.destroy_process_group()
        print(json.dumps({"all_reduce_ok": ok}))
    """

    def nccl(self):
        r, s, j = self.python(["--memory", "20GiB"], self.NCCL)
        if j is None:
            return {"ok": False, "error": (r.stdout + r.stderr).strip()[-400:]}
        return dict(j, ok=j["all_reduce_ok"], seconds=round(s, 1))

    TRAIN = """
        import json, time, torch
        try:
            import torchvision
            model = torchvision.models.resnet50(num_classes=1000)
        except ImportError:
            raise SystemExit("torchvision is needed for the overhead part")
        model = model.cuda().to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device="cuda")
        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        for _ in range(15):
            step()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(60):
            step()
        torch.cuda.synchronize()
        print(json.dumps({"step_ms": (time.perf_counter() - start) / 60 * 1e3}))
    """

    def overhead(self):
        plain, held = [], []
        for _ in range(2):  # alternating, to spread drift over both
            r = subprocess.run([sys.executable, "-c", textwrap.dedent(self.TRAIN)], capture_output=True, text=True,
                               env=self.env, timeout=300)
            j = last_json(r.stdout)
            if j is None:
                return {"ok": False, "error": (r.stdout + r.stderr).strip()[-400:]}
            plain.append(j["step_ms"])
            r2, _, j2 = self.python(["--memory", "120GiB"], self.TRAIN)
            if j2 is None:
                return {"ok": False, "error": (r2.stdout + r2.stderr).strip()[-400:]}
            held.append(j2["step_ms"])
        a, b = min(plain), min(held)
        return {"step_ms_without": plain, "step_ms_with": held, "overhead_percent": round((b - a) / a * 100, 2),
                "ok": (b - a) / a < 0.02}

    COMPUTE = """
        import json, time, torch
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        for _ in range(5):
            a @ b
        torch.cuda.synchronize()
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 15:
            for _ in range(10):
                c = a @ b
            torch.cuda.synchronize()
            n += 10
        print(json.dumps({"matmuls": n, "seconds": time.perf_counter() - start}))
    """

    def compute(self):
        results = {}

        def one(name, share):
            results[name] = self.python(["--compute", share, "--tenant", name], self.COMPUTE)
        threads = [threading.Thread(target=one, args=("c30", "30")), threading.Thread(target=one, args=("c70", "70"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        counts = {k: (v[2] or {}).get("matmuls") for k, v in results.items()}
        if not all(counts.values()):
            return {"ok": False, "errors": {k: (v[0].stdout + v[0].stderr)[-300:] for k, v in results.items()}}
        split = counts["c30"] / (counts["c30"] + counts["c70"])
        return {"matmuls": counts, "share_of_30_percent_tenant": round(split * 100, 1),
                "ok": abs(split - 0.30) <= 0.05}

    def compute_agent(self):
        return self._pair_through_agent(("c30", ["--compute", "30"]), ("c70", ["--compute", "70"]), 0.30)

    def compute_noshare(self):
        return self._pair_through_agent(("c70", ["--compute", "70"]), ("memory_only", ["--memory", "8GiB"]), 0.70)

    def _pair_through_agent(self, first, second, first_share):
        """Two jobs under `stoker gpu run` at once, the node's schedule kept by a real `stoker gpu agent`: the
        first job's part of the work done, against `first_share`."""
        if os.geteuid() != 0:
            return {"ok": None, "skipped": "the agent runs as root"}
        state = "/dev/shm/stoker-gpu-check-agent-%d" % os.getpid()
        env = {k: v for k, v in self.env.items() if k != "STOKER_GPU_LEDGER"}
        env["STOKER_GPU_DIR"] = state
        agent = subprocess.Popen([self.args.stoker, "gpu", "agent", "--dir", state, "--interval", "1"], env=env,
                                 stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 20
            while not os.path.exists(state + "/turns.sock") and time.time() < deadline and agent.poll() is None:
                time.sleep(0.05)
            if not os.path.exists(state + "/turns.sock"):
                return {"ok": False, "error": "the agent serves no turns", "log": agent.stderr.read()[-400:]}
            results = {}
            fake = {"PROBE_SECONDS": "4000", "PROBE_KERNEL_US": "1000"}

            def one(name, limits):
                # Without STOKER_GPU_LEDGER: each user's ledger and the agent's turns in the state folder.
                command = [sys.executable, "-c", textwrap.dedent(self.COMPUTE)] if self.cuda else \
                    [self.args.probe, "compute"]
                r, seconds = run([self.args.stoker, "gpu", "run", "--quiet", "--no-place", *limits, "--tenant", name,
                                  "--", *command], env=dict(env, **({} if self.cuda else fake)))
                results[name] = (r, seconds, last_json(r.stdout))
            threads = [threading.Thread(target=one, args=job) for job in (first, second)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            key = "matmuls" if self.cuda else "device_seconds"
            counts = {k: (v[2] or {}).get(key) for k, v in results.items()}
            if not all(counts.values()):
                return {"ok": False, "errors": {k: (v[0].stdout + v[0].stderr)[-300:] for k, v in results.items()}}
            split = counts[first[0]] / (counts[first[0]] + counts[second[0]])
            return {key: counts, "share_of_%s" % first[0]: round(split * 100, 1),
                    "ok": abs(split - first_share) <= 0.05}
        finally:
            agent.terminate()
            try:
                agent.wait(timeout=30)
            except subprocess.TimeoutExpired:
                agent.kill()
            subprocess.run(["rm", "-rf", state])

    GRAPH_SHARED = """
        import json, torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
        x = torch.randn(256, 2048, device="cuda")
        eager = model(x).detach().clone()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        worst, captures = 0.0, 0
        for _ in range(20):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # global capture mode, PyTorch's default
                y = model(x)
            captures += 1
            for _ in range(20):
                graph.replay()
            torch.cuda.synchronize()
            worst = max(worst, float((y - eager).abs().max()))
        print(json.dumps({"captures": captures, "max_difference": worst}))
    """

    def graph_shared(self):
        results = {}

        def one(name, share, code):
            results[name] = self.python(["--compute", share, "--tenant", name], code)
        threads = [threading.Thread(target=one, args=("g30", "30", self.GRAPH_SHARED)),
                   threading.Thread(target=one, args=("c70", "70", self.COMPUTE))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        j = results["g30"][2]
        if j is None:
            return {"ok": False, "error": (results["g30"][0].stdout + results["g30"][0].stderr).strip()[-400:]}
        return dict(j, ok=j["captures"] == 20 and j["max_difference"] < 1e-3,
                    neighbour_matmuls=(results["c70"][2] or {}).get("matmuls"))

    def place(self):
        """Two jobs placed on the card by memory (30 and 50 GiB), each held to its quota; a third that does not
        fit beside them is refused with what is free; the lease file shows both; startup cost of placing."""
        results = {}

        def one(name, quota):
            results[name] = self.python(["--memory", quota], self.HOLD, place=True)
        threads = [threading.Thread(target=one, args=(n, q)) for n, q in (("p30", "30GiB"), ("p50", "50GiB"))]
        for t in threads:
            t.start()
        time.sleep(2)
        view = json.loads(subprocess.run([self.args.stoker, "gpu", "ls", "--json"], capture_output=True, text=True,
                                         env=self.env).stdout or "{}")
        card = (view.get("cards") or [{}])[0]
        too_big = "%dGiB" % max(1, (card.get("free_bytes", 0) >> 30) + 1)
        refused, _ = self.gpu_run(["--memory", too_big], ["true"], place=True)
        for t in threads:
            t.join()
        out = {k: v[2] or {} for k, v in results.items()}
        held_ok = all(abs(out[k].get("allocated", 0) - q * GiB) <= 64 * MiB and out[k].get("reported_total") == q * GiB
                      for k, q in (("p30", 30), ("p50", 50)))
        started = time.perf_counter()
        for _ in range(20):
            subprocess.run(["true"], check=True)
        plain = (time.perf_counter() - started) / 20
        started = time.perf_counter()
        for _ in range(20):
            self.gpu_run(["--memory", "1GiB"], ["true"], place=True)
        placed = (time.perf_counter() - started) / 20
        return {"jobs": out, "inventory": view.get("inventory"), "leases_while_running": len(view.get("leases", [])),
                "card_leased_bytes": card.get("leased_bytes"), "third_request": too_big,
                "third_refused": refused.returncode == 1 and "does not fit now" in refused.stderr,
                "refusal": refused.stderr.strip()[:300], "gpu_run_startup_ms": round((placed - plain) * 1e3, 2),
                "ok": held_ok and refused.returncode == 1 and len(view.get("leases", [])) == 2}

    def main(self, parts):
        for part in parts:
            needs_gpu = part not in ("resolve", "property", "accounting", "compute_agent", "compute_noshare")
            if needs_gpu and not self.cuda:
                self.results[part] = {"ok": None, "skipped": "no CUDA device"}
                continue
            print("[share] %s ..." % part, flush=True)
            try:
                self.results[part] = getattr(self, part)()
            except Exception as e:  # one part's failure does not hide the others'
                self.results[part] = {"ok": False, "error": repr(e)[-400:]}
            print("[share] %s: %s" % (part, json.dumps(self.results[part])[:600]), flush=True)
        for path in (self.ledger, self.leases, self.leases + ".lock", self.env.get("FAKE_GPU_STATE")):
            if path and os.path.exists(path):
                os.unlink(path)
        return self.results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stoker", required=True)
    p.add_argument("--probe", required=True)
    p.add_argument("--json", required=True)
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--fake", help="the fake driver's folder (a dry run without a GPU)")
    args = p.parse_args()
    parts = [x for x in args.parts.split(",") if x]
    unknown = set(parts) - set(PARTS)
    if unknown:
        p.error("unknown parts: %s (known: %s)" % (", ".join(sorted(unknown)), ", ".join(PARTS)))
    results = Check(args).main(parts)
    with open(args.json, "w") as f:
        json.dump(results, f, indent=2)
    return 0 if all(r.get("ok") is not False for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
