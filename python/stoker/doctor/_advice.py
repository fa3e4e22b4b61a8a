"""The doctor's verdict and report: what the account says, most costly
first, each with a fix and the gain it predicts."""
import os

from ._timeline import CATEGORIES


def _gain(lost):
    return lost / (1.0 - lost) if lost < 1.0 else float("inf")


def verdict(d):
    """[(finding, fix, predicted steps/s gain as a fraction)] most costly first, for Doctor d."""
    a = d.account()
    share = a["share"]
    findings = []
    wait = share["data_wait"]
    if wait > 0.05:
        kind = "input-bound" if wait > 0.20 else "moderately input-bound"
        findings.append(("%s: %.0f%% of step time waiting for data" % (kind, 100 * wait), _input_fix(d),
                         _gain(wait)))
    if share["checkpoint"] > 0.02:
        saves = max(1, d.stall_counts["checkpoint"])
        cost = a["seconds"]["checkpoint"] / saves
        # Young's interval: the one that loses least to saving and to recomputing after a failure.
        interval = (2.0 * cost * d._mtbf_s) ** 0.5
        findings.append(("checkpoint stalls: %.0f%% of step time saving (%d saves, %.2f s each)" % (
            100 * share["checkpoint"], saves, cost),
            "save with stoker.checkpoint.Checkpointer: training waits only for the snapshot, the write goes on "
            "in the background; at this cost and a mean time between failures of %.0f h, save every %.0f s"
            % (d._mtbf_s / 3600.0, interval), _gain(share["checkpoint"])))
    if share["h2d_copy"] > 0.05:
        pageable = d._pageable_copies and d._pageable_copies == d._copies
        loader = _loader_name(d)
        findings.append(("host-to-device copies: %.0f%% of step time%s" % (
            100 * share["h2d_copy"], " from pageable memory" if pageable else ""),
            "pageable copies: use stoker.%s(device=\"cuda\") (pinned buffers, its own copy stream) or "
            "pin_memory=True" % loader if pageable else "copy on a side stream: stoker.%s(device=\"cuda\")" % loader,
            _gain(share["h2d_copy"])))
    host_sync = a["host_seconds"]["sync"] / a["wall_s"] if a["wall_s"] > 0 else 0.0
    if max(share["sync"], host_sync) > 0.05:
        # While the host waits for the GPU the GPU computes; the cost is the queue it drains, which the
        # next stall then cannot hide. The host's share bounds it.
        findings.append(("host synchronisation: the training thread waited for the GPU %.0f%% of step time "
                         "(.item(), .cpu(), torch.cuda.synchronize() each step)" % (100 * host_sync),
                         "read losses every N steps, or keep them on the GPU and sum there (predicted gain: "
                         "at most)", _gain(max(share["sync"], host_sync))))
    if share["communication"] > 0.05:
        findings.append(("exposed communication: %.0f%% of step time waiting in collectives" % (
            100 * share["communication"]),
            "a rank that waits in collectives waits for the slowest rank (stoker doctor compares them) or for "
            "the network: overlap the gradient all-reduce with the backward pass (DDP buckets, "
            "gradient_as_bucket_view=True), accumulate more micro-batches per all-reduce (no_sync()), or use "
            "a larger batch per rank", _gain(share["communication"])))
    if share["launch"] > 0.10:
        findings.append(("launch-bound: the GPU waited %.0f%% of step time for the host to queue work" % (
            100 * share["launch"]), "capture the step in a CUDA graph or torch.compile it; " + _launch_fix(d),
            _gain(share["launch"])))
    findings.sort(key=lambda f: -f[2])
    return findings


def _loader_name(d):
    return "TokenLoader" if d._loader is not None and "tokens" in d._loader.stats() else "Loader"


def _launch_fix(d):
    cores = os.cpu_count() or 1
    threads = d._loader.stats().get("threads") if d._loader is not None else None
    if threads is not None and threads >= cores:
        return "the training thread competes with the loader's %d threads on %d cores: num_threads=%d or \"auto\"" % (
            threads, cores, max(1, cores - 1))
    return "give the training thread a core of its own"


def _input_fix(d):
    if d._loader is None:
        return "use stoker.Loader (native threads, no worker processes) with device=\"cuda\""
    stats = d._loader.stats()
    if "tokens" in stats:
        return _token_input_fix(stats, d.account())
    threads = stats.get("threads")
    cores = os.cpu_count() or 1
    if threads is not None and threads >= cores - 1:
        return ("the loader's %d threads are saturated: gpu_preprocess=True, decode=\"gpu\", or a lighter "
                "dataset (stoker pack --max-side 400, which pays when many images are larger: stoker inspect "
                "--images 1000 shows how many)" % threads)
    return "raise the loader's num_threads (now %s of %d cores)" % (threads, cores)


def _token_input_fix(stats, account):
    """stoker.TokenLoader: packing rows costs ~60 us a batch of 8 x 2048 tokens from the page cache, so a
    wait for it is storage (page faults on the .bin, downloads), prefetch too shallow for uneven reads, or,
    where the loader never made the loop wait, the hand-over of each batch to Python."""
    waited, steps = account["seconds"]["data_wait"], max(1, account["steps"])
    if stats["wait_s"] < 0.5 * waited:
        return ("the token loader had each batch ready (it made the loop wait %.3f s of the %.3f s): the wait is "
                "the hand-over of each batch to Python (%.0f us), which counts only because steps are short "
                "(%.1f ms): larger batches, or several micro-batches a step, spread it" % (
                    stats["wait_s"], waited, 1e6 * (waited - stats["wait_s"]) / steps,
                    1000 * account["wall_s"] / steps))
    built = max(1, stats["batches_built"])
    if stats["remote_wait_s"] > 0.5 * stats["build_s"]:
        return ("the token loader waited %.1f s for downloads: raise connections= or read_ahead_batches= (the "
                "chunks fetched ahead of the order), give it a larger cache_size=, or copy the dataset to local "
                "disk" % stats["remote_wait_s"])
    wall_s = account["wall_s"]
    busy = stats["build_s"] / wall_s if wall_s > 0 else 0.0
    if busy > 0.8:
        return ("the token loader's packing thread is busy %.0f%% of the time (%.1f ms a batch), reading the .bin "
                "files from storage: put them on faster local storage or in memory (/dev/shm)" % (
                    100 * busy, 1000 * stats["build_s"] / built))
    return ("the token loader keeps up on average (its packing thread busy %.0f%%) but not at every step: raise "
            "prefetch= (now %d)" % (100 * busy, stats["prefetch"]))


def what_if_perfect_loader(d, step, batch, steps):
    """Doctor.what_if_perfect_loader's experiment; returns its figures."""
    a = d.account()
    if a["steps"] == 0 or a["wall_s"] <= 0:
        raise RuntimeError("what_if_perfect_loader: no steps measured yet")
    measured = a["steps"] / a["wall_s"]
    predicted = measured / max(1e-9, 1.0 - a["share"]["data_wait"])
    if d._torch is not None:
        d._torch.cuda.synchronize()
    start = d._clock()
    for _ in range(steps):
        step(batch)
    if d._torch is not None:
        d._torch.cuda.synchronize()
    replayed = steps / (d._clock() - start)
    return {"measured_steps_per_s": measured, "predicted_steps_per_s": predicted,
            "replayed_steps_per_s": replayed, "prediction_error": predicted / replayed - 1.0}


def report(d):
    """The account, one line per category, and the verdict, for Doctor d."""
    a = d.account()
    lines = ["stoker doctor: %d steps, %.2f s, %.1f ms per step" % (
        a["steps"], a["wall_s"], 1000 * a["wall_s"] / a["steps"] if a["steps"] else 0.0)]
    for c in CATEGORIES:
        if a["seconds"][c] > 0 or c == "compute":
            lines.append("  %-14s %8.3f s  %5.1f%%" % (c, a["seconds"][c], 100 * a["share"][c]))
    findings = verdict(d)
    if not findings:
        lines.append("verdict: compute-bound (%.0f%% of step time computing): the loader and the stalls "
                     "cost little" % (100 * a["share"]["compute"]))
    for finding, fix, g in findings:
        lines.append("verdict: %s; fix: %s; predicted %+.0f%% steps/s" % (finding, fix, 100 * g))
    if d._what_if is not None:
        w = d._what_if
        lines.append("what if the loader were never waited for: replaying one batch ran %.1f steps/s, the "
                     "account predicted %.1f (%+.0f%%), the loop ran %.1f" % (
                         w["replayed_steps_per_s"], w["predicted_steps_per_s"], 100 * w["prediction_error"],
                         w["measured_steps_per_s"]))
    tuned = d._loader.autotune_log() if d._loader is not None and hasattr(d._loader, "autotune_log") else []
    if tuned:
        stats = d._loader.stats()
        lines.append("loader autotune: now %d threads, prefetch %d; its decisions:" % (stats["threads"],
                                                                                     stats["prefetch"]))
        lines += ["  " + line for line in tuned[-10:]]
    if a["nvml_utilization"] is not None:
        lines.append("NVML utilisation (device %s, counted steps): %.0f%% (stoker's account: %.0f%% compute); GPU "
                     "memory peak %.1f of %.1f GiB" % (d._nvml_device, a["nvml_utilization"],
                                                      100 * a["share"]["compute"], d._nvml.memory_used_max / 2**30,
                                                      d._nvml.memory_total / 2**30))
    host = {c: v for c, v in a["host_seconds"].items() if v > 0}
    if host:
        lines.append("training thread blocked in: " + ", ".join("%s %.3f s" % kv for kv in host.items()))
    skipped = []
    if a["warmup"]["steps"]:
        skipped.append("the first %d steps as warm-up (%.2f s)" % (a["warmup"]["steps"], a["warmup"]["wall_s"]))
    if a["evaluation"]["batches"]:
        skipped.append("%d evaluation batches (%.2f s, fetched without gradients)" % (
            a["evaluation"]["batches"], a["evaluation"]["wall_s"]))
    if a["micro_batches"] > a["steps"] and a["steps"]:
        lines.append("steps are optimizer steps: %d batches in %d steps (gradient accumulation)" % (
            a["micro_batches"], a["steps"]))
    if skipped:
        lines.append("not counted: " + "; ".join(skipped))
    for what in d.cannot_see:
        lines.append("could not see: " + what)
    return "\n".join(lines)
