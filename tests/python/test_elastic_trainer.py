"""stoker.elastic.Trainer end to end: the program's own DDP loop (examples/elastic_ddp.py) under the
launchers, a worker killed, hung or added; and a batch whose optimizer step was skipped."""
import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import SOURCE_DIR
from elastic_harness import (Drained, NUM_SAMPLES, _assert_params_match, _ddp_args, _ddp_check, _ddp_workers, _env, _finish,
                             _free_port, _launch, _tiny_loader, _wait_for_join_request, _wait_for_steps)
from elastic_harness import ddp_reference, packed  # noqa: F401 - fixtures

torch = pytest.importorskip("torch")
import stoker.elastic as elastic  # noqa: E402


@pytest.mark.parametrize("how", ["kill", "stop", "torchrun", "device_group"])
def test_trainer_keeps_a_users_ddp_loop_going_when_a_worker_dies_or_hangs(packed, ddp_reference, tmp_path, how):
    """examples/elastic_ddp.py (its own loop: DDP, StepLR, clipping, 2 micro-batches) under the
    in-process launcher, a worker SIGKILLed or SIGSTOPped mid-run; and under the torchrun path, a worker
    SIGKILLed (all restart from the in-memory snapshots, taken after the scheduler's step). Every rank
    logs every committed step: each sample once per epoch, the replicas' parameter digests equal at
    every step, the learning rate on StepLR's schedule by global step across the failure, and the final
    parameters an uninterrupted process's. "device_group": the in-process kill with DDP over a device
    group made per generation (gloo standing in for NCCL, whose GPU part is scripts/gpu-check's
    elastic_nccl)."""
    port = _free_port()
    launch = ["--standalone", "--nproc-per-node", "3"] if how == "torchrun" else [
        "--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "3", "--min-workers", "1",
        "--max-workers", "3", "--kill-silent-after", "6"]
    env = _env()
    if how == "device_group":
        env["STOKER_ELASTIC_DEVICE_BACKEND"] = "gloo"
    main = Drained([sys.executable, "-m", "stoker.elastic.launch"] + launch + _ddp_args(packed, tmp_path, how, 0.25),
                   env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    # 3 steps x 3 ranks. A worker slower to start than the first meeting's settling (1 s; a loaded machine
    # imports torch slowly) joins a generation later: the group of 3 is what the kill must hit.
    _wait_for_steps(tmp_path / (how + ".jsonl"), 9, main, world_size=3)
    victim = _ddp_workers(main, 3)[2]
    os.kill(victim, signal.SIGSTOP if how == "stop" else signal.SIGKILL)
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    if how == "device_group":
        # Both generations' groups: 3 ranks, then the 2 survivors'.
        assert "rank 0 of 3 (device group: gloo)" in out and "rank 0 of 2 (device group: gloo)" in out, out[-4000:]
    lines = _ddp_check(packed, tmp_path, how)
    sizes = [r["world_size"] for r in sorted(lines, key=lambda r: r["step"])]
    assert 3 in sizes and sizes[-1] == (3 if how == "torchrun" else 2), sizes
    _assert_params_match(ddp_reference, tmp_path / (how + ".pt"))


def test_trainer_takes_in_a_joining_worker(packed, ddp_reference, tmp_path):
    port = _free_port()
    common = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--min-workers", "1", "--max-workers", "3"]
    gate = tmp_path / "hold"
    held = _ddp_args(packed, tmp_path, "join", 0.5) + ["--pause-while", str(gate)]
    main = _launch(common + ["--nproc-per-node", "2"] + held)
    _wait_for_steps(tmp_path / "join.jsonl", 4, main)
    # The job holds still until the joiner has asked to join: a loaded machine can take longer to start
    # it than the rest of the run lasts.
    gate.touch()
    joiner = _launch(common + ["--join", "--nproc-per-node", "1"] + held)
    _wait_for_join_request(port, joiner)
    gate.unlink()
    out, joiner_out = _finish(main), _finish(joiner)
    assert main.returncode == 0 and joiner.returncode == 0, out[-3000:] + joiner_out[-3000:]
    lines = _ddp_check(packed, tmp_path, "join")
    sizes = [r["world_size"] for r in sorted(lines, key=lambda r: r["step"])]
    assert sizes[0] == 2 and sizes[-1] == 3, sizes
    _assert_params_match(ddp_reference, tmp_path / "join.pt")


def test_trainer_commits_a_batch_whose_optimizer_step_was_skipped(packed):
    """A GradScaler that finds inf gradients skips optimizer.step(): the batch still commits (stepped
    False), the step count goes on, and each sample is still seen once. One process: no launcher."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    commits = []
    trainer = elastic.Trainer(model, opt, _tiny_loader(packed, 16), epochs=2, mode="single",
                              on_commit=lambda info: commits.append(info))
    for images, labels, _ in trainer:
        with trainer.step():
            loss = torch.nn.functional.cross_entropy(trainer.model(images), labels % 4) * trainer.loss_weight(
                len(labels))
            loss.backward()
            if trainer.global_step + 1 != 3:  # step 3 "found inf gradients"
                opt.step()
            opt.zero_grad()
    assert [c["step"] for c in commits] == list(range(14))
    assert [c["stepped"] for c in commits] == [i != 3 for i in range(14)]
    for epoch in range(2):
        seen = sorted(i for c in commits if c["epoch"] == epoch for i in c["samples"])
        assert seen == list(range(NUM_SAMPLES))
    assert trainer.summary.steps == 14


def test_a_scheduler_made_before_the_trainer_neither_warns_nor_misses_a_step(packed):
    """The Trainer wraps optimizer.step() after the program made its LR
    scheduler, which had wrapped it to count steps: torch's schedulers then
    warn "optimizer.step() has been overridden after learning rate scheduler
    initialization" unless the wrapper carries their mark (torch 1.13's and
    2.x's differ). No such warning, and the schedule counts every step."""
    import warnings
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    trainer = elastic.Trainer(model, opt, _tiny_loader(packed, 16), epochs=1, mode="single", scheduler=scheduler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for images, labels, _ in trainer:
            with trainer.step():
                loss = torch.nn.functional.cross_entropy(trainer.model(images), labels % 4)
                (loss * trainer.loss_weight(len(labels))).backward()
                opt.step()
                scheduler.step()
                opt.zero_grad()
    assert not [str(w.message) for w in caught if "scheduler" in str(w.message)], [str(w.message) for w in caught]
    assert scheduler.last_epoch == trainer.global_step + 1 == 7
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1 * 0.5 ** 3)


SCALER_JOB = str(SOURCE_DIR / "tests" / "python" / "elastic_scaler_job.py")


def _scaler_steps(path):
    out = {}
    for line in open(path):
        rec = json.loads(line)
        out.setdefault(rec["step"], []).append(rec)
    return out


def test_trainer_carries_the_scalers_state_to_a_joining_worker(packed, tmp_path):
    """A loss scaler (GradScaler's protocol; two planted overflows skip the
    optimizer's step and halve the scale) under the Trainer: 2 workers, a
    third joins mid-run and receives the scaler's state with the model's.
    Every rank's scale at every step equals an uninterrupted process's."""
    ref_log = tmp_path / "ref.jsonl"
    subprocess.run([sys.executable, SCALER_JOB, "--data", packed, "--log", str(ref_log)], check=True, env=_env(),
                   capture_output=True)
    reference = {step: recs[0] for step, recs in _scaler_steps(ref_log).items()}
    assert [reference[s]["stepped"] for s in sorted(reference)] == [s not in (3, 8) for s in range(14)]
    port = _free_port()
    log = tmp_path / "run.jsonl"
    common = ["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--min-workers", "1", "--max-workers", "3"]
    gate = tmp_path / "hold"
    job = [SCALER_JOB, "--data", packed, "--log", str(log), "--step-delay", "0.4", "--pause-while", str(gate)]
    main = _launch(common + ["--nproc-per-node", "2"] + job)
    _wait_for_steps(log, 6, main)  # 3 steps x 2 ranks
    gate.touch()  # the job holds still until the joiner has asked to join (torch 2 takes seconds to import)
    joiner = _launch(common + ["--join", "--nproc-per-node", "1"] + job)
    _wait_for_join_request(port, joiner)
    gate.unlink()
    out, joiner_out = _finish(main), _finish(joiner)
    assert main.returncode == 0 and joiner.returncode == 0, out[-3000:] + joiner_out[-3000:]
    steps = _scaler_steps(log)
    assert sorted(steps) == list(range(14))
    assert max(len(recs) for recs in steps.values()) == 3, "the joiner never committed a step"
    for step, recs in steps.items():
        for rec in recs:
            want = reference[step]
            assert (rec["scale"], rec["growth"], rec["stepped"]) == (want["scale"], want["growth"],
                                                                     want["stepped"]), (step, rec, want)


@pytest.mark.skipif(not hasattr(getattr(torch, "amp", None), "GradScaler"),
                    reason="torch's GradScaler on the CPU needs torch >= 2.3; this is %s" % torch.__version__)
def test_a_grad_scaler_survives_a_commit_lost_after_unscale(packed, tmp_path):
    """examples/elastic_ddp.py --amp (torch's GradScaler; on the CPU the
    scaler alone, in float32), two workers: the commit of step 3, inside
    scaler.step() after the gradients were unscaled, fails on one worker
    alone. The two re-form and that worker, behind, receives the state; its
    scaler must have forgotten the failed step (else the next unscale_()
    raises "unscale_() has already been called" in the program's loop). An
    inf gradient at step 5 is skipped by both, and the parameters end as one
    process's, which skipped the same step."""
    flags = ["--amp", "--inf-at", "5"]
    subprocess.run([sys.executable] + _ddp_args(packed, tmp_path, "ref", 0) + flags, check=True, env=_env(),
                   capture_output=True)
    env = dict(_env(), STOKER_ELASTIC_TEST_LOSE_COMMIT="3", STOKER_ELASTIC_TEST_DIE_LOCAL_RANK="1")
    proc = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "2",
                    "--min-workers", "1", "--max-workers", "2"] + _ddp_args(packed, tmp_path, "run", 0) + flags,
                   env=env)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "failed on this worker alone" in out, out[-4000:]
    lines = _ddp_check(packed, tmp_path, "run")
    assert sorted((r["step"], r["rank"]) for r in lines if not r["stepped"]) == [(5, 0), (5, 1)]
    _assert_params_match(torch.load(tmp_path / "ref.pt"), tmp_path / "run.pt")


def _dict_loader(packed, batch):
    import stoker
    import stoker.transforms as T
    return stoker.Loader(packed, global_batch_size=batch, with_indices=True, log_epochs=False, num_threads=1,
                         fields={"image": stoker.Image(transform=T.Compose([T.Resize(8), T.CenterCrop(8)])),
                                 "label": stoker.Int("cls"), "key_bytes": stoker.Bytes("cls")})


def test_dict_batches_train_as_tuples_do(packed):
    """Typed fields (dict batches) through run() and the Trainer, one process: train_step gets each
    micro-batch as a dict slice, accumulate() slices a dict whole, each sample is committed once per
    epoch, and the trained parameters are those of the same run on (images, labels) tuples."""
    def run(loader, dict_step):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        commits, sizes = [], []

        def step(*args):
            if dict_step:
                (batch,) = args
                assert set(batch) == {"image", "label", "key_bytes", "__index__"}
                assert len(batch["key_bytes"]) == len(batch["label"]) == len(batch["__index__"])
                x, y = batch["image"], batch["label"]
            else:
                x, y = args
            sizes.append(len(y))
            return torch.nn.functional.cross_entropy(model(x), y % 4)
        elastic.run(step, model=model, optimizer=opt, loader=loader, epochs=2, mode="single",
                    policy=elastic.BatchPolicy(16, max_rank_batch=5),
                    on_commit=lambda info: commits.append(info))
        return model, commits, sizes

    tuples, tuple_commits, tuple_sizes = run(_tiny_loader(packed, 16), False)
    dicts, dict_commits, dict_sizes = run(_dict_loader(packed, 16), True)
    assert dict_sizes == tuple_sizes and max(dict_sizes) == 5  # micro-batches of at most 5
    for epoch in range(2):
        seen = sorted(i for c in dict_commits if c["epoch"] == epoch for i in c["samples"])
        assert seen == list(range(NUM_SAMPLES))
    assert [c["samples"] for c in dict_commits] == [c["samples"] for c in tuple_commits]
    for a, b in zip(dicts.parameters(), tuples.parameters()):
        assert torch.equal(a, b)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    commits = []
    trainer = elastic.Trainer(model, opt, _dict_loader(packed, 16), epochs=1, mode="single",
                              on_commit=lambda info: commits.append(info))
    for batch in trainer:
        assert isinstance(batch, dict)
        with trainer.step():
            parts = list(trainer.accumulate(batch, parts=2))
            assert sum(len(part["label"]) for part, _ in parts) == len(batch["label"])
            for part, weight in parts:
                assert len(part["key_bytes"]) == len(part["image"])
                loss = torch.nn.functional.cross_entropy(trainer.model(part["image"]), part["label"] % 4) * weight
                loss.backward()
            opt.step()
            opt.zero_grad()
    assert sorted(i for c in commits for i in c["samples"]) == list(range(NUM_SAMPLES))


def test_trainer_evicts_a_straggler_and_goes_on_without_it(packed, ddp_reference, tmp_path):
    """examples/elastic_ddp.py, three workers; the one of local rank 2 computes 0.2 s longer each step
    (before its backward pass, so DDP makes the others wait for it). StragglerPolicy(1.5, 4, min_seconds=0.1)
    (the healthy ones' steps of a few ms are not judged: see the run() test) judges from
    the second step (the first has no previous time) and evicts it after four slow steps in a row; the
    other two re-form at once and go on: each sample still once, the replicas equal, the schedule kept, and
    the uninterrupted run's parameters reached."""
    port = _free_port()
    main = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % port, "--nproc-per-node", "3",
                    "--min-workers", "1", "--max-workers", "3"] + _ddp_args(packed, tmp_path, "straggler", 0)
                   + ["--straggler", "1.5:4:0.1", "--slow", "2:0.2"])
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    assert "was a straggler" in out and "this worker leaves the job" in out, out[-4000:]
    assert "evicted=" in out  # the evicted worker's summary says why
    lines = _ddp_check(packed, tmp_path, "straggler")
    sizes = [r["world_size"] for r in sorted(lines, key=lambda r: r["step"])]
    assert sizes[0] == 3 and sizes[-1] == 2, sizes
    # Four judged steps in a row: the earliest verdict is at the commit of step 4; DDP's bucket rebuild in
    # its second iteration (a broadcast in the forward pass) makes the others wait there once, which ends
    # a streak, so it usually comes two steps later (and a fast worker descheduled on a busy machine can
    # end one more).
    steps_of_three = sorted({r["step"] for r in lines if r["world_size"] == 3})
    assert steps_of_three == list(range(len(steps_of_three))) and 5 <= len(steps_of_three) <= 11, out[-6000:]
    _assert_params_match(ddp_reference, tmp_path / "straggler.pt")


def test_straggler_policy_from_a_command_lines_spec():
    assert repr(elastic.StragglerPolicy.from_spec("1.5:50")) == repr(elastic.StragglerPolicy(1.5, 50))
    assert elastic.StragglerPolicy.from_spec("2:3:0.1", action="warn").min_seconds == 0.1
    for bad in ("1.5", "1.5:x", "1.5:3:0.1:9", "0.5:3", ""):
        with pytest.raises(ValueError, match="FACTOR:STEPS"):
            elastic.StragglerPolicy.from_spec(bad)


def test_straggler_policy_needs_a_streak_of_one_rank():
    policy = elastic.StragglerPolicy(factor=1.5, steps=3)
    assert policy.observe([0.1, 0.1, 0.3]) is None
    assert policy.observe([0.1, 0.1, 0.3]) is None
    verdict = policy.observe([0.1, 0.12, 0.3])  # the others' median is 0.11
    assert verdict[0] == 2 and abs(verdict[1] - (3 + 3 + 0.3 / 0.11) / 3) < 1e-9
    # The streak restarts after a verdict, after a fast step, and when another rank is the slow one.
    for times in ([0.1, 0.1, 0.3], [0.1, 0.1, 0.3], [0.1, 0.1, 0.14], [0.3, 0.1, 0.1], [0.3, 0.1, 0.1]):
        assert policy.observe(times) is None
    assert policy.observe([0.3, 0.1, 0.1])[0] == 0
    assert policy.observe([None, 0.1, 0.3]) is None  # an unknown time ends a streak
    assert elastic.StragglerPolicy(steps=1, min_seconds=0.05).observe([0.001, 0.001, 0.04]) is None
    with pytest.raises(ValueError, match="factor"):
        elastic.StragglerPolicy(factor=1.0)
    with pytest.raises(ValueError, match="action"):
        elastic.StragglerPolicy(action="kill")
    with pytest.raises(TypeError, match="StragglerPolicy"):
        elastic.Trainer(torch.nn.Linear(2, 2), None, None, epochs=1, straggler=2.0)


def test_the_armed_watch_calls_its_abort_once_when_a_member_is_gone():
    """The watch an abortable device group (NCCL) arms in the heartbeat thread: it calls its abort
    within the heartbeat timeout (1 s here) of the member after this worker going silent, marks the
    generation for the others, fires once; a mark left by another member's watch, and the group going
    on without this worker, fire it too. Alive members do not, nor anything once the job finished."""
    import datetime
    import threading
    import time
    from torch.distributed import TCPStore
    from stoker.elastic._rendezvous import Rendezvous
    port = _free_port()
    store = TCPStore("127.0.0.1", port, None, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    watch = Rendezvous("127.0.0.1:%d" % port, 1, 2, heartbeat_interval=0.1, heartbeat_timeout=1.0)
    stop = threading.Event()

    def beat():
        while not stop.wait(0.1):
            store.add("hb/peer-b", 1)
    beating = threading.Thread(target=beat, daemon=True)
    beating.start()

    def wait_for(fired, seconds):
        start = time.monotonic()
        while not fired and time.monotonic() - start < seconds:
            time.sleep(0.02)
        return time.monotonic() - start
    try:
        fired = []
        watch.arm("peer-b", 1, fired.append)
        time.sleep(2.5)
        assert fired == [], fired  # its heartbeat moves
        stop.set()
        took = wait_for(fired, 6.0)
        assert len(fired) == 1 and "peer-b stopped answering" in fired[0], fired
        assert took < 3.0, took  # heartbeat_timeout 1 s, a check every 0.5 s
        assert watch.aborted_why == fired[0]
        assert store.get("g1/gone").decode() == fired[0]  # the others' watches read it
        time.sleep(1.0)
        assert len(fired) == 1  # once

        marked = []
        watch.arm(None, 2, marked.append)  # alone: no successor to watch, only the mark
        time.sleep(1.0)
        assert marked == []
        store.set("g2/gone", "peer-c died (its launcher reaped it)")
        wait_for(marked, 3.0)
        assert marked == ["peer-c died (its launcher reaped it)"]

        left = []
        watch.arm(None, 3, left.append)
        store.add("gen", 5)
        wait_for(left, 3.0)
        assert len(left) == 1 and "went on to generation 5" in left[0], left
        watch.disarm()
        assert watch.aborted_why is None

        finished = []  # the job is done: a member leaving then is no failure
        watch.arm(None, 6, finished.append)
        store.set("finished", "10")
        store.set("g6/gone", "peer-d stopped answering")
        time.sleep(1.5)
        assert finished == []
    finally:
        stop.set()
        watch.close()


TOKEN_JOB = '''
import json, os, sys, time
import torch, stoker, stoker.elastic
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Embedding(500, 8), torch.nn.Linear(8, 500))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
loader = stoker.TokenLoader(sys.argv[1], seq_len=16, global_batch_size=6, with_indices=True)
pending = []

def log(info):  # each committed step: the global batch's rows, and this rank's with their documents' pieces
    line = json.dumps({"step": info["step"], "rank": info["rank"], "world_size": info["world_size"],
                       "batch": info["samples"], "rows": info["rank_samples"], "docs": pending[0]}) + "\\n"
    fd = os.open(sys.argv[2], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, line.encode())
    os.close(fd)

trainer = stoker.elastic.Trainer(model, optimizer, loader, epochs=1, on_commit=log, timeout=5)
for batch in trainer:
    pending[:] = [batch["documents"]]
    with trainer.step():
        for part, weight in trainer.accumulate(batch, parts=2):
            assert part["cu_seqlens"][-1] == part["input_ids"].numel()
            logits = trainer.model(part["input_ids"])
            (torch.nn.functional.cross_entropy(logits.flatten(0, 1), part["labels"].flatten()) * weight).backward()
        time.sleep(0.1)
        optimizer.step()
        optimizer.zero_grad()
'''


def test_trainer_feeds_a_language_model_from_a_token_loader_through_a_worker_s_death(tmp_path):
    """stoker.TokenLoader under the elastic Trainer (it raised KeyError 'num_samples' at the first batch):
    3 workers, one SIGKILLed mid-run; every token of every document is trained exactly once, by 3 workers
    and then by 2, and micro-batches keep their segment boundaries."""
    import numpy as np

    import stoker
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 500, int(rng.integers(1, 40))) for _ in range(120)]
    stoker.write_tokens(tmp_path / "corpus", documents)
    (tmp_path / "token_job.py").write_text(TOKEN_JOB)
    log = tmp_path / "steps.jsonl"
    main = _launch(["--in-process", "--rdzv-endpoint", "127.0.0.1:%d" % _free_port(), "--nproc-per-node", "3",
                    "--min-workers", "1", "--max-workers", "3", "--kill-silent-after", "6",
                    str(tmp_path / "token_job.py"), str(tmp_path / "corpus"), str(log)])
    _wait_for_steps(log, 9, main, world_size=3)
    workers = subprocess.run(["pgrep", "-P", str(main.pid)], capture_output=True, text=True).stdout.split()
    workers = sorted(int(p) for p in workers if b"token_job.py" in open("/proc/%s/cmdline" % p, "rb").read())
    assert len(workers) == 3, workers
    os.kill(workers[2], signal.SIGKILL)
    out = _finish(main)
    assert main.returncode == 0, out[-4000:]
    # The epoch's rows in order, from one uninterrupted process: row id -> the documents' pieces it holds.
    reference = stoker.TokenLoader(tmp_path / "corpus", seq_len=16, global_batch_size=6, with_indices=True,
                                   world_size=1, rank=0)
    pieces = {}
    for batch in reference:
        pieces.update(zip(batch["__index__"].tolist(), [[list(p) for p in row] for row in batch["documents"]]))
    steps = {}
    for line in open(log):
        record = json.loads(line)
        steps.setdefault(record["step"], {})[record["rank"]] = record
        # What a rank trained is the reference's rows at its ids (a killed rank may miss its last line: the
        # global batch every rank logs covers its rows).
        assert record["docs"] == [pieces[i] for i in record["rows"]]
    rows = []
    for step, by_rank in sorted(steps.items()):
        batches = {tuple(r["batch"]) for r in by_rank.values()}
        assert len(batches) == 1, "step %d: the ranks disagree on the global batch" % step
        rows += batches.pop()
    assert sorted(rows) == list(range(reference.num_rows)), "a row lost or trained twice"
    trained = [(d, p) for i in rows for _, d, offset, length in pieces[i] for p in range(offset, offset + length)]
    assert sorted(trained) == sorted((d, p) for d, doc in enumerate(documents) for p in range(len(doc)))
    sizes = {r["world_size"] for by_rank in steps.values() for r in by_rank.values()}
    assert sizes == {3, 2}, sizes
