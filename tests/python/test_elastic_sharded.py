"""A model sharded within replica groups (FSDP2 over
stoker.elastic.replica_group_mesh()), fault tolerant across the groups,
under run(): the launcher's --replica-group-size, whole-group admission, the
commit of a step whose last collective failed on one worker alone, sharded
checkpoints, straggling groups, and the runs end to end (the Trainer's:
test_elastic_sharded_trainer.py). The runs need torch >= 2.6 (FSDP2 on
gloo): Debian's torch 1.13 runs the rest here; they run by hand in a torch
2.x environment, and scripts/gpu-check's "elastic_hsdp" part runs their
bench (bench/elastic_hsdp.py) on the GPU machine's torch."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from elastic_harness import (EXAMPLE, _assert_params_match, _check_log, _env, _example_args, _finish, _free_port,
                             _has_fsdp2, _launch, _summaries, _wait_for_steps, _workers, needs_fsdp2)
from elastic_harness import packed, reference  # noqa: F401 - fixtures

torch = pytest.importorskip("torch")
import stoker.elastic as elastic  # noqa: E402
from stoker.elastic import _sharded  # noqa: E402
from stoker.elastic._rendezvous import Rendezvous  # noqa: E402


# ---- pieces that need no FSDP ----------------------------------------------------------------


class _FakeStore:
    """The store calls the rendezvous' group logic makes (compare_set as _peek uses it)."""

    def __init__(self, values):
        self.values = {k: v.encode() for k, v in values.items()}

    def compare_set(self, key, expected, desired):
        value = self.values.get(key)
        if value is None:
            if expected == "":
                self.values[key] = desired.encode()
                return desired.encode()
            return expected.encode()
        if value == expected.encode():
            self.values[key] = desired.encode()
            return desired.encode()
        return value


def _rendezvous_over(specs):
    r = Rendezvous.__new__(Rendezvous)  # the group logic alone: no store server, no heartbeat threads
    r.store, r._specs, r.replica = _FakeStore({"rgm/" + who: spec for who, spec in specs.items()}), {}, ("a", 0, 2)
    return r


def test_a_generation_admits_whole_replica_groups_only():
    r = _rendezvous_over({"w1": "a:0:2", "w2": "b:0:2", "w3": "a:1:2", "w4": "c:0:2", "w5": "c:1:2"})
    # b has one of its two workers: not admitted; the others keep their registration order.
    assert r._admitted(["w1", "w2", "w3", "w4", "w5"]) == ["w1", "w3", "w4", "w5"]
    assert r._admitted(["w2"]) == []
    # A worker outside any replica group is a group of its own.
    assert r._admitted(["w1", "w3", "plain"]) == ["w1", "w3", "plain"]


def test_a_forming_generation_waits_for_a_coming_group_but_not_for_a_broken_one():
    r = _rendezvous_over({"w1": "a:0:2", "w2": "a:1:2", "w3": "b:0:2", "w4": "b:1:2", "n1": "new:0:2"})

    def alive(*living):
        return lambda who, now: who in living
    # b lost w4 (gone): its w3 will leave, so nobody waits for b.
    assert r._groups_to_wait_for(r.store, {"w1", "w2", "w3"}, ["w1", "w2", "w3", "w4"], alive("w1", "w2", "w3"),
                                 0.0) == []
    # w4 is alive and simply not registered yet: b is coming.
    assert r._groups_to_wait_for(r.store, {"w1", "w2", "w3"}, ["w1", "w2", "w3", "w4"],
                                 alive("w1", "w2", "w3", "w4"), 0.0) == ["b"]
    # A joining group with one of its two registered is waited for.
    assert r._groups_to_wait_for(r.store, {"w1", "w2", "n1"}, ["w1", "w2"], alive("w1", "w2", "n1"), 0.0) == ["new"]


def test_gradient_shards_are_scaled_by_the_group_and_missing_ones_stay_none():
    a, b, c = (torch.nn.Parameter(torch.zeros(n)) for n in (3, 2, 1))
    a.grad, c.grad = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0])
    flat = _sharded.pack_local_gradients(torch, [a, b, c], 2, torch.device("cpu"))
    # FSDP2's reduce-scatter averaged over the group of 2: the shard is scaled back to the group's sum.
    assert flat.tolist() == [2.0, 4.0, 6.0, 0.0, 0.0, 8.0, 1.0, 0.0, 1.0]
    a.grad = c.grad = None
    _sharded.unpack_local_gradients(torch, [a, b, c], flat)
    assert a.grad.tolist() == [2.0, 4.0, 6.0] and b.grad is None and c.grad.tolist() == [8.0]


def test_replica_group_mesh_outside_the_launcher_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("STOKER_ELASTIC_REPLICA_GROUP", raising=False)
    with pytest.raises(elastic.ElasticError, match="--replica-group"):
        elastic.replica_group_mesh()
    monkeypatch.setenv("STOKER_ELASTIC_REPLICA_GROUP", "g:2:2")
    with pytest.raises(elastic.ElasticError, match="index out of the group"):
        _sharded.replica_group()


def test_launcher_replica_group_size_must_divide_the_workers(tmp_path):
    script = tmp_path / "noop.py"
    script.write_text("")
    for flags, message in ((["--in-process", "--nproc-per-node", "4", "--replica-group-size", "3"], "does not divide"),
                           (["--nproc-per-node", "4", "--replica-group-size", "2"], "goes with --in-process")):
        r = subprocess.run([sys.executable, "-m", "stoker.elastic.launch", "--rdzv-endpoint",
                            "127.0.0.1:%d" % _free_port(), *flags, str(script)], env=_env(), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and message in r.stderr, r.stderr


_GROUP_SCRIPT = textwrap.dedent("""
    import os, sys, time
    group, index, size = os.environ["STOKER_ELASTIC_REPLICA_GROUP"].rsplit(":", 2)
    with open(sys.argv[1], "a") as f:
        f.write("%s %s %s %d\\n" % (group, index, size, os.getpid()))
    incarnation = int(group.rsplit(".", 1)[1])
    if incarnation == 0:
        if index == "1":
            sys.exit(1)      # a failed worker: its sibling is killed, the group starts again
        time.sleep(60)       # (killed by the launcher)
    if sys.argv[2] == "fatal" and incarnation == 1:
        time.sleep(2)        # both groups have started again by now
        import torch.distributed as dist
        host, port = os.environ["STOKER_ELASTIC_STORE"].rsplit(":", 1)
        dist.TCPStore(host, int(port), None, False).set("fatal", "the test's own stop")
        sys.exit(2)
""")


@pytest.mark.parametrize("ending", ["restart", "fatal"])
def test_launcher_restarts_a_replica_group_whole_unless_the_job_stopped(tmp_path, ending):
    script = tmp_path / "group.py"
    script.write_text(_GROUP_SCRIPT)
    seen = tmp_path / "seen.txt"
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "4",
                    "--replica-group-size", "2", str(script), str(seen), ending])
    out = _finish(proc, timeout=120)
    rows = [line.split() for line in seen.read_text().splitlines()]
    groups = sorted({row[0] for row in rows})
    # Two groups of two; both lose their second worker and start again once (incarnation 1). A first worker
    # may be killed before it writes its row.
    assert sorted(g.rsplit(".", 1)[1] for g in groups) == ["0", "0", "1", "1"], rows
    again = sorted((row[0].rsplit(".", 1)[0], row[1]) for row in rows if row[0].endswith(".1"))
    assert [index for _, index in again] == ["0", "1", "0", "1"] and len({g for g, _ in again}) == 2, rows
    assert sum(1 for row in rows if row[0].endswith(".0") and row[1] == "1") == 2, rows
    assert all(row[2] == "2" for row in rows), rows
    assert out.count("stopping the group") == 2 + (2 if ending == "fatal" else 0), out
    if ending == "restart":
        assert proc.returncode == 0, out
        assert out.count("starting replica group") == 2, out
    else:
        assert proc.returncode != 0, out
        assert "is not started again: the job stopped (the test's own stop)" in out, out


_FAILING_GROUP = textwrap.dedent("""
    import os, sys
    group, index, size = os.environ["STOKER_ELASTIC_REPLICA_GROUP"].rsplit(":", 2)
    incarnation = int(group.rsplit(".", 1)[1])
    with open(sys.argv[1], "a") as f:
        f.write("%s %s\\n" % (group, index))
    if sys.argv[2] == "trains":  # (each worker: the first to exit has set it before the launcher kills the other)
        import torch.distributed as dist  # what a worker's first commit marks (_sharded_steps.py)
        host, port = os.environ["STOKER_ELASTIC_STORE"].rsplit(":", 1)
        dist.TCPStore(host, int(port), None, False).set("trained/" + group, "1")
    sys.exit(1 if incarnation < 5 else 0)
""")


@pytest.mark.parametrize("starts", ["fail", "trains"])
def test_launcher_stops_restarting_a_group_whose_starts_keep_failing(tmp_path, starts):
    """A program that fails before its first step (a bug at start-up) would
    have its group restarted --max-restarts times (100 by default): the
    launcher stops after --max-failed-starts (3) starts in a row that failed
    before the job committed a step with them. A group whose starts did
    train (each marks it at its first commit) is started again as before."""
    script = tmp_path / "group.py"
    script.write_text(_FAILING_GROUP)
    seen = tmp_path / "seen.txt"
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "2",
                    "--replica-group-size", "2", "--max-restarts", "10", str(script), str(seen), starts])
    out = _finish(proc, timeout=120)
    incarnations = sorted({line.split()[0].rsplit(".", 1)[1] for line in seen.read_text().splitlines()}, key=int)
    if starts == "fail":
        assert proc.returncode != 0, out
        assert incarnations == ["0", "1", "2"], (incarnations, out)
        assert "replica group 0 is not started again: its last 3 starts each failed before the job committed a " \
            "step with it (last exit 1;" in out, out
    else:
        assert proc.returncode == 0, out
        assert incarnations == ["0", "1", "2", "3", "4", "5"], (incarnations, out)
        assert "is not started again" not in out, out


_MISCONFIGURED = textwrap.dedent("""
    import sys, torch, stoker.elastic
    model = torch.nn.Linear(2, 2)
    stoker.elastic.run(lambda x, y: None, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                       loader=None, epochs=1, straggler=float(sys.argv[1]))
""")


def test_a_misconfigured_program_stops_the_job_rather_than_restart_its_groups(tmp_path):
    """run()'s refusal of its arguments (here straggler=2.0, not a
    StragglerPolicy) would meet every new group again: it sets the job's
    fatal mark, and no group is started again (without it, each group was
    restarted --max-restarts times)."""
    script = tmp_path / "misconfigured.py"
    script.write_text(_MISCONFIGURED)
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "4",
                    "--replica-group-size", "2", "--max-restarts", "3", str(script), "2.0"])
    out = _finish(proc, timeout=120)
    assert proc.returncode != 0, out
    assert "starting replica group" not in out, out
    assert "is not started again: the job stopped (TypeError: straggler= takes a stoker.elastic.StragglerPolicy" \
        in out, out


def test_a_model_sharded_over_another_mesh_is_refused():
    if not _has_fsdp2():
        pytest.skip("needs FSDP2")
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = torch.nn.Linear(2, 2)
        fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
        # run() and the Trainer take it only over replica_group_mesh()'s mesh.
        with pytest.raises(elastic.ElasticError, match="not over stoker.elastic.replica_group_mesh"):
            elastic.Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), loader=None, epochs=1)
        with pytest.raises(elastic.ElasticError, match="not over stoker.elastic.replica_group_mesh"):
            elastic.run(lambda x, y: None, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loader=None, epochs=1)
    finally:
        dist.destroy_process_group()


# ---- runs (FSDP2) ------------------------------------------------------------------------------------


def _sharded_launch(port, workers, group_size, packed, tmp_path, delay, env=None, extra=()):
    args = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", str(workers),
            "--replica-group-size", str(group_size), "--min-workers", str(group_size), "--max-workers", str(workers)]
    return _launch(args + _example_args(packed, tmp_path, "run", delay, ["--shard", *extra]),
                   **({"env": dict(_env(), **env)} if env else {}))


@needs_fsdp2
@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_failed_replica_group_is_replaced_and_no_sample_is_lost(packed, reference, tmp_path, how):  # noqa: F811
    """Two groups of two sharding the model. A worker of the second group is
    SIGKILLed (or SIGSTOPped: its heartbeat stops); the first group goes on
    alone within seconds, the launcher stops the rest of the broken group and
    starts it again, and the new group joins with the live group's shards.
    Every sample once per epoch; the final parameters are the one-process
    run's."""
    proc = _sharded_launch(_free_port(), 4, 2, packed, tmp_path, 0.5)
    _wait_for_steps(tmp_path / "run.jsonl", 3, proc)
    victim = _workers(proc, 4)[3]
    os.kill(victim, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    out = _finish(proc, timeout=180)
    assert proc.returncode == 0, out[-6000:]
    lines = _check_log(tmp_path, "run")
    sizes = [r["world_size"] for r in lines]
    assert sizes[0] == 4 and 2 in sizes, sizes
    _assert_params_match(reference, tmp_path / "run.pt")
    assert "replica group 1 lost worker %d" % victim in out, out[-6000:]
    survivors = [s for s in _summaries(tmp_path, "run") if s["world_sizes"][:2] == [4, 2]]
    assert len(survivors) == 2, _summaries(tmp_path, "run")
    for s in survivors:
        # The first group re-formed within a second of noticing (a kill: at once; a hang: 3 s of silence).
        assert s["recovery_seconds"][0] < 2.0, s
    if how == "kill":
        assert sizes[-1] == 4, sizes  # the replaced group joined before the end
        joined = [s for s in _summaries(tmp_path, "run") if s["restored_step"] is not None]
        assert len(joined) == 2, _summaries(tmp_path, "run")


@needs_fsdp2
@pytest.mark.parametrize("local_rank", ["0", "1"])
def test_a_commit_lost_by_one_worker_is_committed_from_its_reduced_shard(packed, reference, tmp_path,  # noqa: F811
                                                                        local_rank):
    """One group of two: the commit's last collective "fails" on one worker
    alone (fault injection) after completing on the other. No other group
    holds its shard, so only its own reduced shard can bring it to the
    committed step: it commits that step when the two re-form. Either worker
    (so also rank 0, which reports each step: it receives the step's report
    from the other)."""
    proc = _sharded_launch(_free_port(), 2, 2, packed, tmp_path, 0.0,
                           env={"STOKER_ELASTIC_TEST_LOSE_COMMIT": "3",
                                "STOKER_ELASTIC_TEST_DIE_LOCAL_RANK": local_rank})
    out = _finish(proc, timeout=180)
    assert proc.returncode == 0, out[-6000:]
    assert "failed on this worker alone" in out, out[-6000:]
    _check_log(tmp_path, "run")
    _assert_params_match(reference, tmp_path / "run.pt")
    assert all(s["steps"] == len(_check_log(tmp_path, "run")) for s in _summaries(tmp_path, "run"))


@needs_fsdp2
def test_when_every_group_fails_the_job_stops_rather_than_start_afresh(packed, tmp_path):  # noqa: F811
    proc = _sharded_launch(_free_port(), 2, 2, packed, tmp_path, 0.3)
    _wait_for_steps(tmp_path / "run.jsonl", 3, proc)
    os.kill(_workers(proc, 2)[0], signal.SIGKILL)
    out = _finish(proc, timeout=180)
    assert proc.returncode != 0, out[-6000:]
    assert "no live worker holds them (every replica group failed)" in out, out[-6000:]
    assert out.count("starting replica group") == 1, out[-6000:]  # once, and not again once the job stopped
    steps = [r["step"] for r in _check_log_partial(tmp_path)]
    assert steps == sorted(set(steps)), steps  # nothing trained twice


def _check_log_partial(tmp_path):
    import json
    with open(tmp_path / "run.jsonl") as f:
        return [json.loads(line) for line in f]



@needs_fsdp2
def test_workers_without_samples_in_a_last_batch_still_run_their_group(packed, tmp_path):  # noqa: F811
    """A global batch of 33 over 100 samples leaves a last batch of one
    sample for 4 workers: three have none, yet FSDP's collectives need
    their groups whole (they run an earlier sample with weight zero). The
    parameters match one process's."""
    import json
    args = ["--data", packed, "--epochs", "2", "--global-batch", "33", "--timeout", "5"]
    subprocess.run([sys.executable, EXAMPLE, *args, "--save-params", str(tmp_path / "ref.pt")], check=True,
                   env=_env(), capture_output=True)
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "4",
                    "--replica-group-size", "2", "--min-workers", "4", "--max-workers", "4", EXAMPLE, *args,
                    "--shard", "--log", str(tmp_path / "run.jsonl"), "--save-params", str(tmp_path / "run.pt")])
    out = _finish(proc, timeout=180)
    assert proc.returncode == 0, out[-6000:]
    lines = [json.loads(line) for line in open(tmp_path / "run.jsonl")]
    assert [len(r["samples"]) for r in lines if r["epoch"] == 0] == [33, 33, 33, 1], lines
    _assert_params_match(torch.load(tmp_path / "ref.pt"), tmp_path / "run.pt")


# ---- persistent checkpoints of a sharded model ---------------------------------------------------


def test_the_oldest_replica_group_writes_the_checkpoints():
    from stoker.elastic._sharded_checkpoint import writer_key
    # The generation a group first trained in comes first; its place by group id breaks a tie.
    assert writer_key(3, 0) > writer_key(2, 7) > writer_key(2, 1)


def test_a_sharded_run_refuses_to_resume_from_a_plain_checkpoint(tmp_path):
    import stoker
    from stoker.elastic._sharded_checkpoint import sharded_steps
    assert sharded_steps(tmp_path / "none yet") == {}
    with stoker.Checkpointer(str(tmp_path / "plain"), group=None) as ckpt:
        ckpt.save(4, {"model": {"w": torch.ones(2)}})
    with pytest.raises(elastic.ElasticError, match=r"step 4\) was written by a run of a whole model"):
        sharded_steps(tmp_path / "plain")


def _resume_args(tmp_path, every):
    return ["--shard", "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", str(every)]


@needs_fsdp2
def test_a_sharded_job_resumes_from_its_checkpoint_when_every_group_fails(packed, reference, tmp_path):  # noqa: F811
    """One group of two, checkpointing every 2 steps: a worker is SIGKILLed,
    so no live worker holds the job's state. The group started again resumes
    from the newest checkpoint (not from scratch, and without stopping the
    job); the steps after it are trained again from the same position, so
    the parameters are the one-process run's."""
    port = _free_port()
    args = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "2",
            "--replica-group-size", "2", "--min-workers", "2", "--max-workers", "2"]
    proc = _launch(args + _example_args(packed, tmp_path, "run", 0.3, _resume_args(tmp_path, 2)))
    _wait_for_steps(tmp_path / "run.jsonl", 5, proc)
    os.kill(_workers(proc, 2)[0], signal.SIGKILL)
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "every replica group failed: restoring step" in out, out[-6000:]
    assert "the steps after it are trained again" in out, out[-6000:]
    _check_log(tmp_path, "run")
    _assert_params_match(reference, tmp_path / "run.pt")
    restored = [s["restored_step"] for s in _summaries(tmp_path, "run")]
    assert len(restored) == 2 and restored[0] == restored[1] and restored[0] >= 2 and restored[0] % 2 == 0, restored


@needs_fsdp2
def test_a_sharded_job_started_again_resumes_from_its_newest_checkpoint(packed, reference, tmp_path):  # noqa: F811
    """A job of two groups of two trains one epoch (steps 0-6, a checkpoint
    every 4: steps 0 and 4 written by one group, each worker its shards);
    the checkpoint reads back whole for other tools. A new job on the same
    directory with the full epochs resumes from step 4, trains steps 5 and
    6 again, and ends where one uninterrupted process does."""
    import stoker

    def launch(extra):
        args = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "4",
                "--replica-group-size", "2", "--min-workers", "4", "--max-workers", "4"]
        proc = _launch(args + _example_args(packed, tmp_path, "run", 0.0, _resume_args(tmp_path, 4) + extra))
        out = _finish(proc, timeout=240)
        assert proc.returncode == 0, out[-6000:]
        return out

    launch(["--epochs", "1"])
    steps = [c["step"] for c in stoker.list_checkpoints(str(tmp_path / "ckpt"))]
    assert steps == [0, 4], steps
    whole = stoker.load_latest(str(tmp_path / "ckpt"))
    assert whole.step == 4
    assert {k: tuple(v.shape) for k, v in whole.state["model"].items()} == \
        {k: tuple(v.shape) for k, v in reference.items()}
    out = launch([])
    assert "a new start: restoring step 4 from" in out, out[-6000:]
    _check_log(tmp_path, "run")
    _assert_params_match(reference, tmp_path / "run.pt")
    assert [s["restored_step"] for s in _summaries(tmp_path, "run")][-4:] == [4] * 4, _summaries(tmp_path, "run")


@needs_fsdp2
def test_a_straggling_replica_group_leaves_whole_and_the_others_go_on(packed, reference, tmp_path):  # noqa: F811
    """Two groups of two; the worker of local rank 3 computes 0.25 s more a
    step, so its whole group is slow (FSDP's collectives hold its sibling to
    it). With straggler=StragglerPolicy(1.5, 3) the group (both workers)
    leaves after 3 steps, is not started again, and the first group
    finishes alone: every sample once per epoch, the one-process run's
    parameters."""
    proc = _sharded_launch(_free_port(), 4, 2, packed, tmp_path, 0.0,
                           extra=["--straggler", "1.5:3:0.1", "--slow", "3:0.25"])
    out = _finish(proc, timeout=240)
    assert proc.returncode == 0, out[-6000:]
    assert "the replica group of ranks" in out and "was a straggler" in out, out[-6000:]
    assert "starting replica group" not in out, out[-6000:]
    lines = _check_log(tmp_path, "run")
    sizes = [r["world_size"] for r in lines]
    assert sizes[0] == 4 and sizes[-1] == 2, sizes
    _assert_params_match(reference, tmp_path / "run.pt")
    evicted = sorted(s["local_rank"] for s in _summaries(tmp_path, "run") if s["evicted"])
    assert evicted == ["2", "3"], _summaries(tmp_path, "run")
