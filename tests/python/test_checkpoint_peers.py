"""replicate_to_peer: each rank's pieces kept in its own and a peer's
machine memory, and a restarted job (another world size, a machine lost)
restored from them without reading storage; too little in memory, a
damaged copy, a failed copy or a newer checkpoint in storage fall back to
storage or to another holder."""
import os
import pathlib
import random
import shutil
import signal
import sys
import time

import pytest

import stoker
from stoker import _peer_restore

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from sharded_harness import published_since, run, start, stop_after_kill  # noqa: E402


def _copies(machine):
    return sorted(p.name for p in machine.iterdir() if p.suffix == ".json")


def test_a_lost_machine_is_restored_from_its_peer_under_another_world_size(tmp_path):
    ckpt, memory = tmp_path / "ckpt", tmp_path / "memory"
    # What a killed rank 0 left half written on its machine goes with its next copy.
    (memory / "machine-0").mkdir(parents=True)
    (memory / "machine-0" / ".copy-h00000-s00000-step9-dead0000-1.bin").write_bytes(b"half")
    saved = run(3, "peer_save", ckpt, "1,2", memory, results=tmp_path / "r1")
    assert not (memory / "machine-0" / ".copy-h00000-s00000-step9-dead0000-1.bin").exists()
    for r in saved:
        stats = r["stats"]
        assert stats["peer_copies"] == 2 and stats["peer_copy_failures"] == 0, stats
        assert stats["last_peer_copy_step"] == 2 and stats["peer_copy_s"] > 0
    # Each machine holds its own rank's pieces and its previous peer's, of step 2 only.
    for r in range(3):
        names = _copies(memory / ("machine-%d" % r))
        assert [n.split("-")[1:4] for n in names] == sorted([["h%05d" % r, "s%05d" % s, "step2"]
                                                            for s in (r, (r - 1) % 3)]), names
    # Storage gone, machine 1 lost: two ranks on machines 0 and 2 get step 2 from memory.
    shutil.rmtree(memory / "machine-1")
    shutil.move(str(ckpt), str(tmp_path / "elsewhere"))
    loaded = run(2, "peer_load", ckpt, memory, "0,2", results=tmp_path / "r2")
    assert [(r["step"], r["path"].startswith("memory:")) for r in loaded] == [(2, True), (2, True)]
    assert [r["extra"] for r in loaded] == [{"rank": 0, "step": 2}, {"rank": 1, "step": 2}]
    assert all("torch" in r["rng"] for r in loaded)
    assert not ckpt.exists()

    # Machines 1 and 2 lost: rank 1's pieces are nowhere in memory, so storage is read, and the log says why.
    shutil.move(str(tmp_path / "elsewhere"), str(ckpt))
    shutil.rmtree(memory / "machine-2")
    fallback = run(3, "peer_load", ckpt, memory, "0,1,2", results=tmp_path / "r3")
    assert [r["step"] for r in fallback] == [2, 2, 2]
    assert "no step's copies are complete in memory (step 2: 2 of 3 ranks' copies)" in fallback[0]["output"]
    assert all(r["path"].endswith("step-2") for r in fallback)


def test_a_damaged_copy_is_named_and_not_used(tmp_path):
    ckpt, memory = tmp_path / "ckpt", tmp_path / "memory"
    run(2, "peer_save", ckpt, "3", memory, results=tmp_path / "r1")
    # Rank 0's pieces are on machines 0 and 1; damage the copy on machine 0: machine 1's serves.
    bad = next((memory / "machine-0").glob("copy-h00000-s00000-*.bin"))
    raw = bytearray(bad.read_bytes())
    raw[100] ^= 0xFF
    bad.write_bytes(bytes(raw))
    shutil.move(str(ckpt), str(tmp_path / "elsewhere"))
    # Blocks of 256 bytes and more travel on their own (emb, optimizer.m: into their targets; model.w's
    # column blocks: beside them), the smaller ones packed.
    loaded = run(2, "peer_load", ckpt, memory, "0,1", 256, results=tmp_path / "r2")
    assert [r["step"] for r in loaded] == [3, 3] and loaded[0]["path"].startswith("memory:")
    assert "fails its checksum" in loaded[0]["output"] and bad.name[:-4] in loaded[0]["output"]


def test_a_copy_that_fails_is_counted_never_raised_and_nobody_waits_for_it(tmp_path):
    ckpt, memory = tmp_path / "ckpt", tmp_path / "memory"
    saved = run(3, "peer_save", ckpt, "1,2", memory, "1:2", results=tmp_path / "r1", timeout=60)
    failures = [r["stats"]["peer_copy_failures"] for r in saved]
    # Rank 1's memory is full at step 2: its own copy fails, so does rank 0's copy sent to it, and
    # rank 2, whose copy of rank 1's pieces would come from rank 1, gets none; no rank waits.
    assert failures == [1, 1, 1], failures
    errors = [r["stats"]["last_peer_copy_error"] for r in saved]
    assert "rank 1 had no room for this rank's copy of step 2" in errors[0]
    assert "No space left on device" in errors[1]
    assert "rank 1 made no copy of step 2" in errors[2]
    assert [r["stats"]["last_peer_copy_step"] for r in saved] == [1, 1, 1]
    assert [c["step"] for c in stoker.list_checkpoints(ckpt)] == [1, 2]  # storage unaffected
    # Memory holds all of step 1 but not step 2: storage's step 2, newer, is read.
    loaded = run(3, "peer_load", ckpt, memory, "0,1,2", results=tmp_path / "r2")
    assert [r["step"] for r in loaded] == [2, 2, 2]
    assert "storage holds a newer step (2) than memory (1)" in loaded[0]["output"]


def test_the_choice_needs_every_source_and_prefers_the_newest():
    # (step, save id, source, world) per rank
    summaries = [[(2, "a-2", 0, 3), (2, "a-2", 2, 3), (1, "a-1", 0, 3)],
                 [(2, "a-2", 1, 3), (1, "a-1", 1, 3), (1, "a-1", 2, 3)],
                 [(2, "a-2", 1, 3)]]
    choice, why = _peer_restore._choose(summaries, durable=1)
    assert why is None and choice == (2, "a-2", 3, {0: [0], 1: [1, 2], 2: [0]})
    holders = choice[3]
    # A rank holding a copy serves itself; the others are spread over the holders.
    assert [_peer_restore._server(holders, r, 1) for r in range(4)] == [1, 1, 2, 2]
    assert [_peer_restore._server(holders, r, 0) for r in range(3)] == [0, 0, 0]
    choice, why = _peer_restore._choose([summaries[0], [], []], durable=None)
    assert choice is None and "step 2: 2 of 3 ranks' copies" in why
    choice, why = _peer_restore._choose(summaries, durable=3)
    assert choice is None and "newer step (3)" in why


def test_blocks_cover_requests_across_piece_boundaries():
    # "w" 6 x 4 in three row pieces of 2 (sources 0-2); a request of rows 1-4, columns 1-3.
    pieces = {s: [["w", "F32", [2, 4], [6, 4], [2 * s, 0], 0, 32]] for s in range(3)}
    plans = _peer_restore._blocks([[("w", [1, 1], [4, 2])]], pieces)
    plan, covered = plans[0]
    assert covered == [8]
    assert [(b[1], b[3], b[4]) for b in plan] == [(0, [1, 1], [2, 3]), (1, [2, 1], [4, 3]), (2, [4, 1], [5, 3])]


def test_replicate_to_peer_needs_a_group(tmp_path):
    with pytest.raises(ValueError, match="replicate_to_peer=True copies"):
        stoker.Checkpointer(tmp_path / "c", group=None, replicate_to_peer=True)
    with pytest.raises(ValueError, match="collective"):
        stoker.load_latest(tmp_path / "c", from_peers=True)


def test_a_kill_of_any_rank_while_copying_never_restores_a_wrong_state(tmp_path):
    """Two rounds of three ranks saving with copies in a loop, one SIGKILLed
    at a random moment, then the rest: every restart restores (from memory
    where it is complete, else from storage) exactly one step's state."""
    ckpt, memory = tmp_path / "ckpt", tmp_path / "memory"
    rng = random.Random(31)
    next_step, sources = 1, []
    for round_ in range(2):
        procs = start(3, "peer_loop", ckpt, next_step, memory, results=tmp_path / "r")
        deadline = time.monotonic() + 90  # torch's import and the group, then the round's first publish
        while not published_since(ckpt, next_step) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert published_since(ckpt, next_step), "round %d published nothing in 90 s" % round_
        time.sleep(rng.uniform(0, 1.5))  # then a random moment of saving and copying
        os.kill(procs[rng.randrange(3)].pid, signal.SIGKILL)
        stop_after_kill(procs, rng)
        loaded = run(3, "peer_loop_load", ckpt, memory, results=tmp_path / ("l%d" % round_))
        assert len({r["step"] for r in loaded}) == 1, loaded
        sources.append("memory" if loaded[0]["path"].startswith("memory:") else "storage")
        next_step = loaded[0]["step"] + 1
    print("restored from: %s" % ", ".join(sources))
