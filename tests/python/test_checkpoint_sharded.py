"""Sharded checkpoints of distributed jobs: ranks on gloo (separate
processes, as torchrun starts them) save their own pieces; other world sizes
and layouts read them back; SIGKILL of a rank at random points never leaves
a checkpoint that does not load."""
import os
import pathlib
import random
import signal
import sys
import time

import pytest
import torch

import stoker
from stoker import _sharded

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import sharded_ckpt_job as job  # noqa: E402
from sharded_harness import published_since, run, start, stop_after_kill  # noqa: E402


def test_three_ranks_save_replicas_once_and_two_ranks_reshard_on_load(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved = run(3, "save", ckpt, "1,2", results=tmp_path / "r1")
    step2 = ckpt / "step-2"
    assert sorted(p.name for p in step2.iterdir()) == [
        "manifest.json", "rank-00000.json", "rank-00000.safetensors", "rank-00001.json", "rank-00001.safetensors",
        "rank-00002.json", "rank-00002.safetensors"]
    assert not [p for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
    # Bytes written = unique bytes: the replicated embedding once, not three times.
    unique = (job.ROWS * job.COLS * 4) + (job.EMB[0] * job.EMB[1] * 4) + job.MOMENT_ROWS * 3 * 8
    unique += 6 * 4  # "keys", a NumPy array every rank holds: once too
    data = sum((step2 / ("rank-%05d.safetensors" % r)).stat().st_size for r in range(3))
    headers = sum(int.from_bytes((step2 / ("rank-%05d.safetensors" % r)).read_bytes()[:8], "little") + 8
                  for r in range(3))
    assert data - headers == unique
    assert all(s["stats"]["world_size"] == 3 for s in saved)

    # Two ranks, model.w now cut by columns: each reads just its block.
    loaded = run(2, "load", ckpt, results=tmp_path / "r2")
    assert [r["step"] for r in loaded] == [2, 2]

    # One process assembles everything, and the loader / RNG states are per rank.
    whole = stoker.load_latest(ckpt)
    assert whole.step == 2
    job.check_full(whole.state, 2)
    assert whole.rng_states and "torch" in whole.rng_states
    for rank in range(3):
        assert stoker.load_latest(ckpt, rank=rank).extra == {"stoker.step": "2", "stoker.rank": str(rank)}
    # A target that is not contiguous memory (a transposed view) is filled through a host buffer.
    view = torch.zeros((job.COLS, job.ROWS)).t()
    assert not view.is_contiguous()
    stoker.load_latest(ckpt, target={"model": {"w": view}})
    assert torch.equal(view, job.expected("model.w", 2, (job.ROWS, job.COLS)).float())
    # The list and the Hugging Face export.
    assert [c["step"] for c in stoker.list_checkpoints(ckpt)] == [1, 2]
    files = stoker.export_safetensors(step2, tmp_path / "hf", prefix="model.")
    exported = stoker.load_safetensors(files[0])
    assert sorted(exported) == ["emb", "w"]
    assert torch.equal(exported["w"], job.expected("model.w", 2, (job.ROWS, job.COLS)).float())
    split = stoker.export_safetensors(step2, tmp_path / "hf-split", max_file_size=1000)
    assert len(split) > 1 and (tmp_path / "hf-split" / "model.safetensors.index.json").exists()


def test_the_command_line_verifies_a_sharded_checkpoint(tmp_path, cli):
    ckpt = tmp_path / "ckpt"
    run(2, "save", ckpt, "3", results=tmp_path / "r")
    ok = cli("checkpoint", "verify", ckpt)
    assert "sharded over 2 ranks" in ok.stdout and ok.stdout.startswith("ok")
    data = ckpt / "step-3" / "rank-00001.safetensors"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xff
    data.write_bytes(bytes(raw))
    bad = cli("checkpoint", "verify", ckpt, check=False)
    assert bad.returncode == 1 and "CORRUPT" in bad.stdout and "rank-00001.safetensors' block 0" in bad.stdout
    assert cli("checkpoint", "ls", ckpt).stdout.split()[:2] == ["step", "3"]


def test_ranks_that_disagree_on_the_step_all_get_one_clear_error(tmp_path):
    results = run(3, "disagree", tmp_path / "ckpt", results=tmp_path / "r")
    for r in results:
        assert r["error"] and "rank 0 step 5, rank 1 step 6, rank 2 step 7" in r["error"]
    assert not list((tmp_path / "ckpt").glob("step-*"))


def test_a_save_rank_zero_cannot_commit_fails_fast_everywhere_and_the_next_goes_through(tmp_path):
    results = run(3, "fail", tmp_path / "ckpt", results=tmp_path / "r")
    assert results[0]["second"] is None and "CorruptionError" in results[0]["save_error"]
    assert "cover" in results[0]["save_error"]
    for r in results[1:]:
        assert "rank 0 gave up on it" in r["wait_error"] and r["wait_s"] < 30
        assert r["second"] is False and r["save_error"] is None
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-3"]


def test_a_checkpointer_made_on_rank_zero_alone_says_to_pass_group_none(tmp_path):
    results = run(2, "alone", tmp_path / "ckpt", results=tmp_path / "r")
    assert "only 1 of the 2 ranks constructed" in results[0]["error"] and "group=None" in results[0]["error"]
    assert results[0]["seconds"] < 20
    assert stoker.load_latest(tmp_path / "ckpt").step == 1


def test_time_based_intervals_follow_rank_zero_on_every_rank(tmp_path):
    results = run(3, "due", tmp_path / "ckpt", results=tmp_path / "r")
    assert results[0]["due"] == [50, 100, 150]  # rank 0's policy wants one each time it is asked
    assert all(r["due"] == results[0]["due"] for r in results)  # the others' (never) is overruled


def test_one_busy_rank_makes_every_rank_skip(tmp_path):
    results = run(3, "skip", tmp_path / "ckpt", results=tmp_path / "r")
    assert [(r["first"], r["second"], r["skipped"]) for r in results] == [(False, True, 1)] * 3
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-2"]


def test_a_kill_of_any_rank_at_any_moment_leaves_a_complete_checkpoint(tmp_path):
    """15 rounds, 3 ranks saving in a loop: SIGKILL one rank at a random
    moment, then the others; the newest checkpoint always loads, complete
    and verified, and a restarted job cleans up and saves again."""
    ckpt = tmp_path / "ckpt"
    rng = random.Random(30)
    published = 0
    next_step = 1
    interrupted = 0  # kills that landed inside the victim's persist
    for round_ in range(15):
        procs = start(3, "loop", ckpt, next_step, results=tmp_path / "r")
        # torch's import and the group, then the round's first publish (on a busy machine that can take longer
        # than a fixed pause: CI runs three tests at a time), then saves go on (hundreds of them in all).
        deadline = time.monotonic() + 90
        while not published_since(ckpt, next_step) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert published_since(ckpt, next_step), "round %d published nothing in 90 s" % round_
        time.sleep(rng.uniform(0, 1.0))
        # Odd rounds aim inside the victim's own writing (its save's temporary folder there, its part
        # not yet); even rounds kill at a random moment of the loop (snapshot, gather, rank 0's commit).
        victim = rng.randrange(3)
        deadline = time.monotonic() + 30
        temps = []
        while time.monotonic() < deadline:
            temps = [p for p in ckpt.iterdir() if p.name.startswith(".tmp-sharded")] if ckpt.exists() else []
            if temps and (round_ % 2 == 0 or not (temps[0] / ("rank-%05d.json" % victim)).exists()):
                break
            time.sleep(0.0005)
        time.sleep(rng.uniform(0, 0.003 if round_ % 2 else 0.1))
        temps = [p for p in ckpt.iterdir() if p.name.startswith(".tmp-sharded")]
        os.kill(procs[victim].pid, signal.SIGKILL)
        # Landed inside the victim's persist: its part was not yet durable.
        interrupted += bool(temps) and not (temps[0] / ("rank-%05d.json" % victim)).exists()
        stop_after_kill(procs, rng)
        newest = stoker.load_latest(ckpt)
        if newest is not None:
            job.check_loop(newest.state, newest.step)
            published = newest.step
            next_step = newest.step + 1
        assert not [p for p in tmp_path.iterdir() if p.name not in ("ckpt", "r")], "written outside the folder"
    assert published > 0, "no checkpoint was ever published"
    print("kill rounds: %d of 15 interrupted a persist; newest step %d" % (interrupted, published))
    assert interrupted >= 5, "too few kills landed inside a persist (%d) to test anything" % interrupted
    # A new job removes the leftovers of interrupted saves on its first save.
    run(3, "save", ckpt, next_step + 100, results=tmp_path / "r2")
    assert not [p.name for p in ckpt.iterdir() if p.name.startswith(".tmp-")]
    job.check_full(stoker.load_latest(ckpt).state, next_step + 100)


def test_a_checkpoint_behind_http_is_read_by_range_only_where_the_slices_are(tmp_path):
    from remote_servers import Nginx
    ckpt = tmp_path / "ckpt"
    run(3, "save", ckpt, "4", 3, 100, results=tmp_path / "r")  # model.w 3700 x 2400: 3 blocks per rank's file
    server = Nginx(tmp_path)
    try:
        rows, cols = job.ROWS * 100, job.COLS * 100
        w = torch.zeros((10, cols))
        emb = torch.zeros(job.EMB)
        target = {"model": {"w": stoker.Shard(w, (rows, cols), (5, 0)), "emb": emb}}
        loaded = stoker.load_latest(server.url + "/ckpt", target=target, cache_dir=tmp_path / "cache")
        assert loaded.step == 4
        assert torch.equal(w, job.expected("model.w", 4, (rows, cols))[5:15].float())
        assert torch.equal(emb, job.expected("model.emb", 4, job.EMB).float())
        assert loaded.state["optimizer"]["lr"] == 4.5
        fetched = [path for _, _, path, _ in server.requests() if path.endswith(".safetensors")]
        total_blocks = sum(-(-(ckpt / "step-4" / ("rank-%05d.safetensors" % r)).stat().st_size // (4 << 20))
                           for r in range(3))
        # rows 5-14 of model.w lie in rank 0's first block; emb, optimizer.m and the NumPy "keys" in one block each
        assert 1 <= len(fetched) <= 4 < total_blocks, (fetched, total_blocks)
        # A step folder's URL works too, and a missing one is named.
        step = stoker.load_latest(server.url + "/ckpt/step-4", cache_dir=tmp_path / "cache")
        job.check_full(step.state, 4, scale=100)
        with pytest.raises(stoker.CorruptionError, match="step-9' has no manifest.json"):
            stoker.load_latest(server.url + "/ckpt/step-9", cache_dir=tmp_path / "cache")
    finally:
        server.close()


def test_plan_writers_spreads_replicas_and_refuses_disagreement():
    layout = [("a", "F32", (100,), (100,), (0,)), ("b", "F32", (50,), (50,), (0,)), ("c", "F32", (50,), (50,), (0,))]
    masks, load = _sharded.plan_writers([layout, layout, layout])
    assert [sum(m) for m in masks] == [1, 1, 1] and sorted(load) == [200, 200, 400]
    assert all(sum(m[i] for m in masks) == 1 for i in range(3))  # each written once
    # Pieces: each rank writes its own.
    pieces = [[("w", "F32", (2,), (6,), (2 * r,))] for r in range(3)]
    masks, _ = _sharded.plan_writers(pieces)
    assert masks == [[True], [True], [True]]
    with pytest.raises(ValueError, match="ranks 0 and 1 disagree on tensor 'a'"):
        _sharded.plan_writers([layout, [("a", "F16", (100,), (100,), (0,))]])


def test_shard_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match="does not fit in global_shape"):
        stoker.Shard(torch.zeros(4), (6,), (3,))
    with pytest.raises(ValueError, match="same length"):
        stoker.Shard(torch.zeros(4), (6, 1), (0,))
    with pytest.raises(TypeError, match="torch.Tensor"):
        stoker.Shard([1, 2], (2,), (0,))
    # A process alone refuses shards it cannot tile.
    with pytest.raises(ValueError, match="not sharded"):
        with stoker.Checkpointer(tmp_path / "alone", group=None) as ck:
            ck.save(1, {"w": stoker.Shard(torch.zeros(2), (4,), (0,))})
