"""stoker.elastic.Trainer (the program's own loop, examples/elastic_ddp.py
--shard) over a model sharded within replica groups (FSDP2 over
replica_group_mesh()): a failed group replaced, a commit lost by one worker
committed late with the scheduler's state, empty shares, a straggling group,
sharded checkpoints. The runs need torch >= 2.6 (skipped on Debian's torch
1.13); run by hand in a torch 2.x environment."""
import os
import re
import signal
import subprocess
import sys

import pytest

from elastic_harness import (_assert_params_match, _ddp_args, _ddp_check, _ddp_workers, _env, _finish, _free_port,
                             _launch, _wait_for_steps, needs_fsdp2)
from elastic_harness import ddp_reference, packed  # noqa: F401 - fixtures

torch = pytest.importorskip("torch")


def _trainer_launch(workers, packed, tmp_path, delay, env=None, extra=()):
    args = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", str(workers),
            "--replica-group-size", "2", "--min-workers", "2", "--max-workers", str(workers)]
    return _launch(args + _ddp_args(packed, tmp_path, "run", delay) + ["--shard", *extra],
                   **({"env": dict(_env(), **env)} if env else {}))


@needs_fsdp2
def test_the_trainer_trains_a_sharded_model_and_replaces_a_failed_group(packed, tmp_path):  # noqa: F811
    """examples/elastic_ddp.py --shard: the program's own loop (2 micro-batches
    through trainer.accumulate, gradient clipping, StepLR) over a model
    sharded in 2 groups of 2. A worker of the second group is SIGKILLed;
    the first goes on, the group is started again and joins. Every sample
    once per epoch, the shards of every group alike at every step, the
    learning rate on schedule, and the parameters the one-process loop's.
    The clipping norm is small enough to bind, so it must see the whole
    batch's gradient (summed across the groups before it)."""
    clip = ["--clip", "0.05"]
    subprocess.run([sys.executable] + _ddp_args(packed, tmp_path, "ref", 0) + clip, check=True, env=_env(),
                   capture_output=True)
    proc = _trainer_launch(4, packed, tmp_path, 0.5, extra=clip)
    _wait_for_steps(tmp_path / "run.jsonl", 12, proc)  # 4 lines a step
    os.kill(_ddp_workers(proc, 4)[3], signal.SIGKILL)
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    lines = _ddp_check(packed, tmp_path, "run")
    sizes = [r["world_size"] for r in lines]
    assert sizes[0] == 4 and 2 in sizes and sizes[-1] == 4, sizes
    assert {r["shard"] for r in lines} == {0, 1}
    _assert_params_match(torch.load(tmp_path / "ref.pt"), tmp_path / "run.pt")


@needs_fsdp2
@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_a_trainer_commit_lost_by_one_worker_is_committed_late_with_the_schedule(packed, ddp_reference,  # noqa: F811
                                                                                tmp_path, local_rank):
    """One group of two: the commit's collective of step 3 "fails" on one
    worker alone after completing on the other. It commits that step from
    its own (clipped) gradient shards when the two re-form; the scheduler's
    step, which only the program's loop makes, comes from the other worker:
    the learning rate stays on schedule and the parameters are the
    one-process loop's."""
    proc = _trainer_launch(2, packed, tmp_path, 0.0, env={"STOKER_ELASTIC_TEST_LOSE_COMMIT": "3",
                                                          "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK": local_rank})
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "failed on this worker alone" in out, out[-6000:]
    _ddp_check(packed, tmp_path, "run")
    _assert_params_match(ddp_reference, tmp_path / "run.pt")


@needs_fsdp2
def test_trainer_workers_without_samples_in_a_last_batch_still_run_their_group(packed, tmp_path):  # noqa: F811
    """The Trainer's counterpart of the run() test above: a last batch of
    one sample for 4 workers; the three without a sample get an earlier one
    with loss_weight 0 and run their group's FSDP passes. The parameters
    match one process's."""
    import json
    batch = ["--global-batch", "33", "--epochs", "1"]
    subprocess.run([sys.executable] + _ddp_args(packed, tmp_path, "ref", 0) + batch, check=True, env=_env(),
                   capture_output=True)
    proc = _trainer_launch(4, packed, tmp_path, 0.0, extra=batch)
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    check = subprocess.run([sys.executable, _ddp_args(packed, tmp_path, "x", 0)[0], "--check",
                            str(tmp_path / "run.jsonl"), "--data", packed] + batch, env=_env(), capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = [json.loads(line) for line in open(tmp_path / "run.jsonl")]
    last = [r for r in lines if r["step"] == 3]
    assert sorted(len(r["samples"]) for r in last) == [0, 0, 0, 1], last
    reference = torch.load(tmp_path / "ref.pt")
    _assert_params_match(reference, tmp_path / "run.pt")


@needs_fsdp2
def test_the_trainer_evicts_a_straggling_replica_group_whole(packed, ddp_reference, tmp_path):  # noqa: F811
    """The Trainer with straggler=StragglerPolicy(1.5, 3): the worker of
    local rank 3 computes 0.25 s more a step, so its group (local ranks 2
    and 3) leaves whole after 3 steps and the first group finishes alone."""
    proc = _trainer_launch(4, packed, tmp_path, 0.0, extra=["--straggler", "1.5:3:0.1", "--slow", "3:0.25"])
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert re.search(r"the replica group of ranks \d+, \d+ was a straggler", out), out[-6000:]
    assert out.count("this worker leaves the job") == 2 and "starting replica group" not in out, out[-6000:]
    lines = _ddp_check(packed, tmp_path, "run")
    assert lines[0]["world_size"] == 4 and lines[-1]["world_size"] == 2, [r["world_size"] for r in lines]
    _assert_params_match(ddp_reference, tmp_path / "run.pt")


@needs_fsdp2
def test_the_trainer_resumes_a_sharded_model_from_its_checkpoint_when_every_group_fails(packed, ddp_reference,  # noqa: F811
                                                                                       tmp_path):
    """The Trainer's loop with checkpointer=dict(...), one group of two: a
    worker SIGKILLed, the group started again resumes from the newest
    checkpoint, the scheduler's state with it (the learning rate stays on
    schedule), and the run ends where the one-process loop does."""
    proc = _trainer_launch(2, packed, tmp_path, 0.3, extra=["--checkpoint-dir", str(tmp_path / "ckpt"),
                                                            "--checkpoint-every", "2"])
    _wait_for_steps(tmp_path / "run.jsonl", 10, proc)  # 2 lines a step
    os.kill(_ddp_workers(proc, 2)[0], signal.SIGKILL)
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "every replica group failed: restoring step" in out, out[-6000:]
    _ddp_check(packed, tmp_path, "run")
    _assert_params_match(ddp_reference, tmp_path / "run.pt")



@needs_fsdp2
def test_when_every_group_fails_the_trainer_stops_the_job_rather_than_restart_it(packed, tmp_path):  # noqa: F811
    """The Trainer's counterpart of run()'s: one group of two without
    checkpoints, a worker SIGKILLed, so no live worker holds the committed
    steps. The group started again stops the job (the launcher's ``fatal``
    mark) instead of being started again, up to --max-restarts times, only
    to meet the same end."""
    proc = _trainer_launch(2, packed, tmp_path, 0.3)
    _wait_for_steps(tmp_path / "run.jsonl", 4, proc)  # 2 lines a step
    os.kill(_ddp_workers(proc, 2)[0], signal.SIGKILL)
    out = _finish(proc, timeout=180)
    assert proc.returncode != 0, out[-6000:]
    assert "no live worker holds them (every replica group failed)" in out, out[-6000:]
    assert out.count("starting replica group") == 1, out[-6000:]  # once, and not again once the job stopped
    assert "is not started again: the job stopped" in out, out[-6000:]

def _scaler_reference(packed, tmp_path, extra):
    subprocess.run([sys.executable] + _ddp_args(packed, tmp_path, "ref", 0) + extra, check=True, env=_env(),
                   capture_output=True)
    return torch.load(tmp_path / "ref.pt")


def _assert_one_step_skipped_everywhere(lines, step, world):
    skipped = sorted((r["step"], r["rank"]) for r in lines if not r["stepped"])
    assert skipped == [(step, rank) for rank in range(world)], skipped
    scales = {(r["step"], r["rank"]): r["scale"] for r in lines}
    for rank in range(world):  # the scale backs off once, after the skipped step
        assert scales[(step, rank)] == scales[(step - 1, rank)] / 2, scales


@needs_fsdp2
@pytest.mark.parametrize("found_inf", ["torch", "own"])
def test_a_grad_scaler_skips_an_inf_step_on_every_worker_of_a_sharded_model(packed, tmp_path, found_inf):  # noqa: F811
    """A GradScaler (on the CPU: the scaler alone, in float32) over a model
    sharded in 2 groups of 2, one backward pass a step (no accumulate()),
    so the sum across groups is made by the scaler's unscale_(). At step 4,
    rank 2 alone adds bias[0] x inf to its loss: after its group's
    reduce-scatter only its shard holds the inf, and before the sum across
    groups no worker of the first group does. Every worker must skip that
    step, the scale backs off everywhere, and the parameters end as one
    process's, which skipped the same step. ``own``: torch's reduction of
    the inf check over the DTensors' mesh is removed (as on a torch without
    it), so the trainer's own must make it."""
    flags = ["--amp", "--inf-at", "4:2", "--parts", "1"]
    reference = _scaler_reference(packed, tmp_path, ["--amp", "--inf-at", "4", "--parts", "1"])
    proc = _trainer_launch(4, packed, tmp_path, 0.0, extra=flags,
                           env={"STOKER_ELASTIC_TEST_OWN_FOUND_INF": "1"} if found_inf == "own" else None)
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    lines = _ddp_check(packed, tmp_path, "run")
    assert {r["world_size"] for r in lines} == {4}
    _assert_one_step_skipped_everywhere(lines, 4, 4)
    _assert_params_match(reference, tmp_path / "run.pt")


@needs_fsdp2
def test_a_grad_scaler_survives_a_commit_lost_after_unscale(packed, tmp_path):  # noqa: F811
    """One group of two with a GradScaler: the commit of step 3, inside
    scaler.step() after the scaler unscaled the gradients, fails on one
    worker alone. That worker takes the next batch with its scaler's
    per-step mark cleared (else its unscale_() would raise "already been
    called"), commits step 3 late and receives the scaler's state from the
    other. A later inf step is skipped by both; the parameters end as one
    process's."""
    flags = ["--amp", "--inf-at", "5"]
    reference = _scaler_reference(packed, tmp_path, flags)
    proc = _trainer_launch(2, packed, tmp_path, 0.0, extra=flags, env={"STOKER_ELASTIC_TEST_LOSE_COMMIT": "3",
                                                                       "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK": "1"})
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "failed on this worker alone" in out, out[-6000:]
    lines = _ddp_check(packed, tmp_path, "run")
    _assert_one_step_skipped_everywhere([r for r in lines if r["world_size"] == 2], 5, 2)
    _assert_params_match(reference, tmp_path / "run.pt")
