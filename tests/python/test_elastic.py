"""Elastic training end to end on the CPU (gloo): workers killed, hung and
added mid-epoch under stoker's in-process mode, a single process resuming,
and the batch policy (torchrun's runs: test_elastic_torchrun.py). Every
run's step log must hold each sample exactly once per epoch, and the final
parameters must match an uninterrupted run's."""
import os
import signal
import subprocess
import sys
import time

import pytest

from elastic_harness import (EPOCHS, NUM_SAMPLES, Drained, _assert_params_match, _check_log, _env, _example_args, _finish,
                             _free_port, _launch, _lines, _summaries, _tiny_loader, _wait_for_join_request,
                             _wait_for_steps, _workers)
from elastic_harness import packed, reference  # noqa: F401 - fixtures

torch = pytest.importorskip("torch")
import stoker  # noqa: E402
import stoker.elastic as elastic  # noqa: E402
from stoker.elastic import BatchPolicy, rank_share  # noqa: E402


# ---- the batch policy -------------------------------------------------------------

def test_rank_share_splits_any_batch_over_any_world():
    for batch in (0, 1, 7, 16, 100):
        for world in range(1, 20):
            shares = [rank_share(batch, world, r) for r in range(world)]
            assert shares[0][0] == 0 and shares[-1][1] == batch
            assert all(a[1] == b[0] for a, b in zip(shares, shares[1:]))
            sizes = [e - f for f, e in shares]
            assert max(sizes) - min(sizes) <= 1
    with pytest.raises(ValueError):
        rank_share(16, 3, 3)


def test_batch_policy_schedule_lr_rules_and_micro_batches():
    p = BatchPolicy(256, schedule={10: 1024, 30: 4096}, lr_rule="linear", max_rank_batch=100)
    assert [p.global_batch_at(e) for e in (0, 9, 10, 29, 30, 99)] == [256, 256, 1024, 1024, 4096, 4096]
    assert p.lr_factor(1024) == 4.0 and p.largest_batch == 4096
    assert BatchPolicy(256, lr_rule="sqrt").lr_factor(1024) == 2.0
    assert BatchPolicy(256).lr_factor(1024) == 1.0
    assert p.micro_batches(250) == [100, 100, 50] and p.micro_batches(0) == []
    assert BatchPolicy(8).micro_batches(5) == [5]
    for bad in (dict(global_batch=0), dict(global_batch=8, lr_rule="cubic"), dict(global_batch=8, schedule={-1: 4}),
                dict(global_batch=8, schedule={2: 0}), dict(global_batch=8, max_rank_batch=0)):
        with pytest.raises(ValueError):
            BatchPolicy(**bad)


def test_loader_global_batch_arguments(packed):
    with pytest.raises(ValueError, match="not both"):
        stoker.Loader(packed, batch_size=4, global_batch_size=16)
    with pytest.raises(ValueError, match="needs global_batch_size"):
        stoker.Loader(packed, batch_size=4, min_world_size=2)
    loader = stoker.Loader(packed, global_batch_size=10, rank=1, world_size=3, min_world_size=2, log_epochs=False)
    assert loader.global_batch_size == 10 and loader.batch_capacity == 5
    with pytest.raises(ValueError, match="min_world_size 1 or less"):
        loader.reshard(0, 1)
    loader.reshard(1, 2)
    assert (loader.rank, loader.world_size) == (1, 2)
    fixed = stoker.Loader(packed, batch_size=4, log_epochs=False)
    with pytest.raises(stoker.StokerError, match="global_batch_size"):
        fixed.reshard(0, 2)


def _tiny_run(packed, policy, loader, epochs=2, seed=0):
    """One process, in this test: a linear model on 8x8 crops."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    commits = []
    summary = elastic.run(lambda x, y: torch.nn.functional.cross_entropy(model(x), y % 4), model=model,
                          optimizer=opt, loader=loader, epochs=epochs, policy=policy, mode="single",
                          on_commit=lambda info: commits.append((info["epoch"], len(info["samples"]),
                                                                 opt.param_groups[0]["lr"])))
    return model, commits, summary


def test_micro_batches_give_the_same_step_as_one_pass(packed):
    whole, _, _ = _tiny_run(packed, BatchPolicy(16), _tiny_loader(packed, 16))
    parts, _, _ = _tiny_run(packed, BatchPolicy(16, max_rank_batch=5), _tiny_loader(packed, 16))
    for a, b in zip(whole.parameters(), parts.parameters()):
        assert (a - b).abs().max().item() < 1e-5


def test_a_batch_schedule_changes_the_global_batch_and_the_learning_rate(packed, caplog):
    import logging
    caplog.set_level(logging.INFO, logger="stoker.elastic")
    policy = BatchPolicy(16, schedule={1: 32}, lr_rule="linear")
    _, commits, summary = _tiny_run(packed, policy, lambda b: _tiny_loader(packed, b))
    epoch0 = [c for c in commits if c[0] == 0]
    epoch1 = [c for c in commits if c[0] == 1]
    assert len(epoch0) == 7 and len(epoch1) == 4  # ceil(100 / 16), ceil(100 / 32)
    assert sum(n for _, n, _ in epoch0) == NUM_SAMPLES and sum(n for _, n, _ in epoch1) == NUM_SAMPLES
    assert {lr for _, _, lr in epoch0} == {0.1} and {lr for _, _, lr in epoch1} == {0.2}
    assert "learning rate x2 (global batch 16 -> 32 at epoch 1, rule linear)" in caplog.text
    with pytest.raises(elastic.ElasticError, match="schedule needs loader="):
        _tiny_run(packed, policy, _tiny_loader(packed, 16))


def test_a_loader_with_a_per_rank_batch_is_refused_clearly(packed):
    loader = stoker.Loader(packed, batch_size=4, log_epochs=False)
    with pytest.raises(elastic.ElasticError, match="global_batch_size"):
        _tiny_run(packed, BatchPolicy(4), loader)


# ---- end to end ---------------------------------------------------------------------

def test_in_process_survives_a_kill_and_a_join(packed, reference, tmp_path):
    """Four workers; one is SIGKILLed mid-epoch (4 -> 3), then a fifth
    process joins (3 -> 4): two changes in one run, nobody restarted. In a
    ring of four, two survivors are not the dead rank's neighbours: they must
    learn of the failure from the others closing their connections, not from
    the collective timeout."""
    port = _free_port()
    common = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--min-workers", "1", "--max-workers", "4"]
    # Steps of 1 s leave the joiner (a new Python process importing torch) time to arrive before the end;
    # --join makes it fail, rather than start a job of its own, if it came too late.
    # Every worker waits before its step while the gate exists (no collective is in flight there): the joiner
    # is let in however long it takes to start, rather than raced against the job's last steps.
    gate = tmp_path / "gate"
    pause = ["--pause-while", str(gate)]
    main = _launch(common + ["--nproc-per-node", "4"] + _example_args(packed, tmp_path, "run", 1.0, pause))
    log = tmp_path / "run.jsonl"
    _wait_for_steps(log, 3, main)
    victim = _workers(main, 4)[1]
    os.kill(victim, signal.SIGKILL)
    _wait_for_steps(log, 4, main)
    gate.touch()
    joiner = _launch(common + ["--join", "--nproc-per-node", "1"] + _example_args(packed, tmp_path, "run", 1.0, pause))
    _wait_for_join_request(port, joiner)
    gate.unlink()
    out = _finish(main)
    joiner_out = _finish(joiner)
    assert main.returncode == 0, out[-4000:]
    assert joiner.returncode == 0, joiner_out[-4000:]
    lines = _check_log(tmp_path, "run")
    sizes = [r["world_size"] for r in lines]
    assert sizes[0] == 4 and 3 in sizes and sizes[-1] == 4, sizes
    _assert_params_match(reference, tmp_path / "run.pt")
    survivors = [s for s in _summaries(tmp_path, "run") if s["reconfigurations"] == 2]
    assert len(survivors) == 3, _summaries(tmp_path, "run")
    for s in survivors:
        assert s["world_sizes"] == [4, 3, 4]
        assert s["recomputed_steps"] <= 1, s  # only the step in flight at the kill
    assert "the others go on without it" in out
    assert "Timed out" not in out and "timed out" not in out, "a survivor waited for the timeout:\n" + out[-4000:]


def test_the_first_meeting_waits_for_a_worker_slow_to_start(packed, reference, tmp_path):
    """Three workers, the third 4 s slower to start than the others (as
    importing torch can be on a loaded node): the first generation waits for
    it (every worker its launcher started), rather than closing with two after
    the arrivals' 1 s settling and taking it in a generation later."""
    slow = tmp_path / "slow_start.py"
    slow.write_text("import os, runpy, sys, time\n"
                    "if os.environ['LOCAL_RANK'] == '2':\n"
                    "    time.sleep(4)\n"
                    "sys.argv = sys.argv[1:]\n"
                    "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    port = _free_port()
    run = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--min-workers", "1",
                   "--max-workers", "3", "--nproc-per-node", "3", str(slow)]
                  + _example_args(packed, tmp_path, "run", 0.05))
    out = _finish(run)
    assert run.returncode == 0, out[-4000:]
    sizes = [r["world_size"] for r in _check_log(tmp_path, "run")]
    assert set(sizes) == {3}, sizes
    _assert_params_match(reference, tmp_path / "run.pt")


def test_run_evicts_a_straggler_and_goes_on_without_it(packed, reference, tmp_path):
    """run(straggler=StragglerPolicy(1.5, 3, min_seconds=0.1)), three workers; the one of local rank 2
    computes 0.2 s longer each step (min_seconds: the two left, healthy, take a few ms a step, and on a busy
    machine one of them is 1.5x the other for three steps in a row now and then). Its own time (batch to
    the end of its backward, before the reduction that makes the others wait for it) is judged at each
    commit, so it is evicted at the third step's commit; the other two go on at once: each sample still
    once, and the uninterrupted run's parameters reached."""
    port = _free_port()
    main = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "3",
                    "--min-workers", "1", "--max-workers", "3"]
                   + _example_args(packed, tmp_path, "straggler", 0, ["--straggler", "1.5:3:0.1", "--slow", "2:0.2"]))
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    assert "was a straggler" in out and "this worker leaves the job" in out, out[-4000:]
    lines = _check_log(tmp_path, "straggler")
    sizes = [r["world_size"] for r in lines]
    assert sizes[0] == 3 and sizes[-1] == 2, sizes
    # Three slow steps in a row: the verdict comes at the commit of step 2 (a fast worker descheduled on a
    # busy machine can end a streak, and so delay it).
    steps_of_three = sorted({r["step"] for r in lines if r["world_size"] == 3})
    assert steps_of_three == list(range(len(steps_of_three))) and 3 <= len(steps_of_three) <= 8, out[-6000:]
    _assert_params_match(reference, tmp_path / "straggler.pt")
    evicted = [s for s in _summaries(tmp_path, "straggler") if s["evicted"]]
    # The slow worker (its group rank is the rendezvous's to give).
    assert len(evicted) == 1 and evicted[0]["local_rank"] == "2", _summaries(tmp_path, "straggler")
    assert "timed out" not in out.lower(), "a worker waited for the timeout:\n" + out[-4000:]


def test_in_process_leaves_a_hung_worker_behind(packed, reference, tmp_path):
    """A worker that stops answering (SIGSTOP) is noticed by its silent
    heartbeat, the others go on without it, and when it wakes up (before its
    launcher's 10 s kill) it finds itself outside the group and joins
    again."""
    port = _free_port()
    main = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "3",
                    "--min-workers", "2", "--max-workers", "3"] + _example_args(packed, tmp_path, "hang", 0.25))
    log = tmp_path / "hang.jsonl"
    _wait_for_steps(log, 3, main)
    victim = _workers(main, 3)[2]
    os.kill(victim, signal.SIGSTOP)
    _wait_for_steps(log, 6, main)
    os.kill(victim, signal.SIGCONT)
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    _check_log(tmp_path, "hang")
    _assert_params_match(reference, tmp_path / "hang.pt")
    assert "stopped answering (no heartbeat for" in out, out[-4000:]


def test_a_hung_worker_is_noticed_by_its_heartbeat_not_the_collective_timeout(packed, reference, tmp_path):
    """A SIGSTOPped worker with a 30 s collective timeout: the others notice
    its silent heartbeat in a few seconds and go on without it; its launcher
    kills it (--kill-silent-after); every sample still once, and the same
    parameters as an uninterrupted run."""
    port = _free_port()
    main = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "3",
                    "--min-workers", "2", "--max-workers", "3", "--kill-silent-after", "6"] +
                   _example_args(packed, tmp_path, "silent", 0.25, ["--timeout", "30"]))
    log = tmp_path / "silent.jsonl"
    _wait_for_steps(log, 3, main)
    victim = _workers(main, 3)[1]
    os.kill(victim, signal.SIGSTOP)
    stopped = time.monotonic()
    deadline = stopped + 60
    while not any(r["world_size"] == 2 for r in _lines(log)) and time.monotonic() < deadline:
        time.sleep(0.02)
    noticed = time.monotonic() - stopped
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    # The heartbeat times out after 3 s (checked every 0.5 s), then the group re-forms: well inside the
    # 30 s the collective would have waited.
    assert noticed < 15.0, (noticed, out[-4000:])  # 4-5 s on an idle machine (the README's figure)
    assert "stopped answering (no heartbeat for" in out, out[-4000:]
    assert "sent no heartbeat for" in out and "killing it" in out, out[-4000:]
    _check_log(tmp_path, "silent")
    _assert_params_match(reference, tmp_path / "silent.pt")
    print("a hung worker was noticed and the group went on after %.2f s" % noticed)


def _stopped(pids):
    """The first of ``pids`` that is stopped (state T), or None."""
    for pid in pids:
        try:
            with open("/proc/%d/stat" % pid) as f:
                if f.read().rpartition(")")[2].split()[0] == "T":
                    return pid
        except FileNotFoundError:
            pass
    return None


def test_a_worker_that_was_away_does_not_commit_what_the_others_abandoned(packed, reference, tmp_path):
    """A worker stops between step 4's gradient all-reduce and its commit's
    collective; the others leave that collective in flight (their heartbeat
    watch finds it silent) and go on without it. When it wakes, its own
    commit collective completes against what the others left behind: it must
    see that it was away and not commit, rejoin, and every sample still
    count once."""
    port = _free_port()
    env_fault = dict(STOKER_ELASTIC_TEST_STOP_BEFORE_COMMIT="4", STOKER_ELASTIC_TEST_DIE_LOCAL_RANK="2")
    main = Drained([sys.executable, "-m", "stoker.elastic.launch", "--in-process", "--rdzv-endpoint",
                    "127.0.0.1:%d" % port, "--nproc-per-node", "3", "--min-workers", "2",
                    "--max-workers", "3", "--kill-silent-after", "0"] +
                   _example_args(packed, tmp_path, "away", 0.5, ["--timeout", "30"]),
                   env=dict(_env(), **env_fault), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    log = tmp_path / "away.jsonl"
    deadline = time.monotonic() + 90
    victim = None
    while victim is None and time.monotonic() < deadline and main.poll() is None:
        time.sleep(0.1)
        victim = _stopped(_workers(main, 0))
    assert victim is not None, "the worker never stopped itself:\n" + main.output()[-3000:]
    seen = len(_lines(log))
    while not any(r["world_size"] == 2 for r in _lines(log)[seen:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(victim, signal.SIGCONT)
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    assert "test fault: stopping before the commit of step 4" in out, out[-4000:]
    assert "so it does not commit step 4" in out, out[-4000:]
    _check_log(tmp_path, "away")
    _assert_params_match(reference, tmp_path / "away.pt")


def test_in_process_survives_a_failure_during_reconfiguration(packed, reference, tmp_path):
    """A kill, then another worker dies while generation 2 syncs its state:
    the rest form generation 3 and finish."""
    port = _free_port()
    env_fault = dict(STOKER_ELASTIC_TEST_DIE_AT_GENERATION="2", STOKER_ELASTIC_TEST_DIE_LOCAL_RANK="2")
    main = Drained([sys.executable, "-m", "stoker.elastic.launch", "--in-process", "--rdzv-endpoint",
                    "127.0.0.1:%d" % port, "--nproc-per-node", "4", "--min-workers", "1",
                    "--max-workers", "4"] + _example_args(packed, tmp_path, "fault", 0.25),
                   env=dict(_env(), **env_fault), text=True, stdout=subprocess.PIPE,
                   stderr=subprocess.STDOUT, start_new_session=True)
    log = tmp_path / "fault.jsonl"
    _wait_for_steps(log, 3, main)
    os.kill(_workers(main, 4)[0], signal.SIGKILL)
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    assert "test fault: dying while generation 2 syncs" in out
    lines = _check_log(tmp_path, "fault")
    assert lines[-1]["world_size"] == 2, [r["world_size"] for r in lines]
    _assert_params_match(reference, tmp_path / "fault.pt")


def test_in_process_too_few_workers_is_a_clear_error(packed, tmp_path):
    port = _free_port()
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "2",
                    "--min-workers", "3", "--max-workers", "3"] +
                   _example_args(packed, tmp_path, "few", 0, ["--rendezvous-timeout", "2"]))
    out = _finish(proc, timeout=60)
    assert proc.returncode != 0
    assert "only 2 of the minimum 3 workers came to generation 1 within 2 s" in out, out[-3000:]


def test_launcher_refuses_bad_flags():
    nobody = "127.0.0.1:%d" % _free_port()
    for args, message in [(["--nnodes", "3:1", "x.py"], "MIN <= MAX"), (["--nproc-per-node", "gpu", "x.py"],
                                                                         "not a number"),
                          (["--frobnicate", "x.py"], "unknown option"),
                          (["--nproc", "2", "x.py"], "unknown option --nproc (before the script); did you mean "
                                                      "--nproc-per-node?"),
                          (["--rdzv_endpont", "h:1", "x.py"], "did you mean --rdzv-endpoint?"),
                          (["--join", "x.py"], "--join goes with --in-process"),
                          (["--in-process", "--join", "--rdzv-endpoint", nobody, "x.py"], "no job runs at")]:
        r = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", *args], env=_env(), capture_output=True,
                           text=True)
        assert r.returncode != 0 and message in r.stderr + r.stdout, (args, r.stderr)


def test_single_process_needs_no_launcher_and_resumes_past_a_corrupt_checkpoint(packed, reference, tmp_path):
    """Plain `python train.py`: the same API; a rerun resumes from the newest
    checkpoint, skipping (and naming) a corrupt one."""
    ckpt = tmp_path / "ckpt"
    args = _example_args(packed, tmp_path, "one", 0, ["--checkpoint-dir", str(ckpt), "--checkpoint-every", "3"])
    args[args.index("--epochs") + 1] = "1"
    subprocess.run([sys.executable] + args, check=True, env=_env(), capture_output=True)
    steps = sorted(int(d.split("-")[1]) for d in os.listdir(ckpt) if d.startswith("step-"))
    assert steps, os.listdir(ckpt)
    newest = ckpt / ("step-%d" % steps[-1])
    victim = next(p for p in sorted(newest.iterdir()) if p.suffix == ".safetensors")
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    args[args.index("--epochs") + 1] = str(EPOCHS)
    r = subprocess.run([sys.executable] + args, env=_env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipped a corrupt saved state" in r.stderr and str(newest) in r.stderr, r.stderr[-3000:]
    assert "restoring step %d" % steps[-2] in r.stderr, r.stderr[-3000:]
    _assert_params_match(reference, tmp_path / "one.pt")


# ---- the state that travels: learning rates, gradients, snapshots --------------------

def _scheduled_run(packed, ckpt, crash_at=None, weight_decay=0.0):
    """One process, a StepLR stepped at every commit (on every rank), checkpoints every step; optionally the
    run dies after committing step `crash_at`. Returns (model, {step: lr after it}, unused parameter)."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"used": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)),
                                 "unused": torch.nn.Linear(4, 4)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    lrs = {}

    class Crash(Exception):
        pass

    def on_commit(info):
        assert info["rank"] == 0
        if info.get("replayed"):
            return  # the scheduler already stepped for it
        scheduler.step()
        lrs[info["step"]] = opt.param_groups[0]["lr"]
        if info["step"] == crash_at:
            raise Crash()
    try:
        elastic.run(lambda x, y: torch.nn.functional.cross_entropy(model["used"](x), y % 4), model=model,
                    optimizer=opt, loader=_tiny_loader(packed, 16), epochs=2, mode="single", extra_state=scheduler,
                    on_commit=on_commit, on_commit_all_ranks=True,
                    checkpointer=dict(directory=str(ckpt), every_steps=1, keep_last=2))
    except Crash:
        pass
    return model, lrs, model["unused"]


def test_a_resumed_run_keeps_its_schedulers_learning_rate(packed, tmp_path):
    _, straight, _ = _scheduled_run(packed, tmp_path / "straight")
    _, before, _ = _scheduled_run(packed, tmp_path / "resumed", crash_at=7)
    _, after, _ = _scheduled_run(packed, tmp_path / "resumed")
    assert min(after) > 0 and max(before) == 7  # the second run resumed, it did not start over
    # Step by step the resumed run's learning rate is the uninterrupted run's (StepLR halves it every 3
    # steps); before, a restored state had its lr set back to the initial one.
    resumed = {**before, **after}
    assert resumed == straight, (resumed, straight)
    assert straight[13] == pytest.approx(0.1 * 0.5 ** 4)


def test_parameters_without_gradients_keep_none_and_are_not_stepped(packed, tmp_path):
    model, _, unused = _scheduled_run(packed, tmp_path / "ckpt", weight_decay=0.1)
    torch.manual_seed(0)
    fresh = torch.nn.ModuleDict({"used": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4)),
                                 "unused": torch.nn.Linear(4, 4)})
    # A zero gradient would have let weight decay shrink it; None leaves it as it was made.
    assert torch.equal(unused.weight, fresh["unused"].weight)
    assert unused.weight.grad is None
    assert not torch.equal(model["used"][1].weight, fresh["used"][1].weight)


def test_snapshots_are_as_frequent_as_half_a_percent_of_step_time_allows():
    from stoker.elastic._runner import _Runner
    runner = _Runner.__new__(_Runner)
    runner.snapshots, runner.snapshot_every = object(), None
    runner.snapshot_cost, runner.step_seconds, runner.last_snapshot_step = None, None, -1
    runner.step = 0
    assert runner._snapshot_due()  # nothing measured yet: the first step is snapshotted
    # A snapshot that costs 50 ms against 100 ms steps: every 100 steps keeps it within 0.5%.
    runner.snapshot_cost, runner.step_seconds, runner.last_snapshot_step = 0.050, 0.100, 0
    due = [s for s in range(1, 300) if (setattr(runner, "step", s) or runner._snapshot_due())
           and setattr(runner, "last_snapshot_step", s) is None]
    assert due == [100, 200]
    # Its background write counts too: 450 ms of persisting on top makes it every 1,000 steps, but never
    # more than 30 s of training apart (300 steps of 100 ms).
    class Persisting:
        def stats(self):
            return {"last_persist_s": 0.450}
    runner.snapshots, runner.last_snapshot_step = Persisting(), 150
    runner.step = 449
    assert not runner._snapshot_due()
    runner.step = 450
    assert runner._snapshot_due()
    runner.snapshots = object()
    runner.snapshot_cost = 0.0005  # cheap: every step
    runner.step, runner.last_snapshot_step = 201, 200
    assert runner._snapshot_due()
    runner.snapshot_every, runner.step = 4, 202
    assert not runner._snapshot_due()
    runner.step = 203
    assert runner._snapshot_due()


def test_a_programs_nccl_group_gets_only_cuda_tensors():
    """Under torchrun with the program's NCCL group, the runner's host tensors
    (sample ids, agreement, the state's bytes) go through a gloo group beside
    it: before, NCCL got CPU tensors and the run restarted 100 times."""
    from stoker.elastic._group import Group

    class Work:
        def wait(self, *timeout):
            return True

    class FakeGroup:
        def __init__(self, name):
            self.name, self.seen = name, []

        def allreduce(self, tensors, opts):
            self.seen.append(("allreduce", getattr(tensors[0], "is_cuda", False)))
            return Work()

        def broadcast(self, tensors, opts):
            self.seen.append(("broadcast", getattr(tensors[0], "is_cuda", False)))
            return Work()

    class CudaTensor:
        is_cuda = True
    gloo, nccl = FakeGroup("gloo"), FakeGroup("nccl")
    group = Group(gloo, 0, 2, 0, device_pg=nccl)
    group.allreduce(torch.zeros(3))
    group.allreduce(CudaTensor())
    group.broadcast(torch.zeros(3, dtype=torch.uint8), 0)
    assert gloo.seen == [("allreduce", False), ("broadcast", False)]
    assert nccl.seen == [("allreduce", True)]
    alone = Group(gloo, 0, 2, 0)  # gloo only: CUDA tensors too (through the host)
    alone.allreduce(CudaTensor())
    assert gloo.seen[-1] == ("allreduce", True)


def test_a_wrapped_or_sharded_model_is_refused_before_any_step(packed):
    """The runner wraps the module in DDP over each group it forms: a DDP
    the program made, an FSDP module (whose shards that DDP would overwrite
    with rank 0's) or DTensor parameters are refused with what to pass."""
    import torch
    import torch.distributed as dist
    from torch import nn
    loader = stoker.Loader(packed, global_batch_size=8, num_threads=1)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    from stoker.elastic._group import _as_process_group  # torch 2.x's DDP takes a ProcessGroup, not a backend
    store = dist.HashStore()
    pg = _as_process_group(dist.ProcessGroupGloo(store, 0, 1), store, 0, 1, 30.0, "gloo")
    wrapped = nn.parallel.DistributedDataParallel(model, process_group=pg)
    with pytest.raises(TypeError, match=r"takes the module itself, not DistributedDataParallel\(module\): the model"):
        elastic.Trainer(wrapped, opt, loader, epochs=1)
    inside = nn.Sequential(wrapped, nn.ReLU())
    with pytest.raises(TypeError, match="its submodule '0' is wrapped in DDP"):
        elastic.run(lambda *a: None, model=inside, optimizer=opt, loader=loader, epochs=1)

    # FSDP by its class, as the check knows it (torch 1.13's FSDP does not import on Python 3.11).
    class FullyShardedDataParallel(nn.Module):
        pass
    FullyShardedDataParallel.__module__ = "torch.distributed.fsdp.fully_sharded_data_parallel"
    sharded = nn.Sequential(nn.Linear(4, 4))
    sharded.add_module("block", FullyShardedDataParallel())
    with pytest.raises(TypeError, match="its submodule 'block' is sharded by FSDP"):
        elastic.Trainer(sharded, opt, loader, epochs=1)
    # A plain module of the same name elsewhere is the program's own.
    FullyShardedDataParallel.__module__ = "my_models"
    elastic.Trainer(sharded, opt, loader, epochs=1)
