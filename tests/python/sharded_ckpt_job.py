"""One rank of a sharded-checkpoint test job (tests/python/test_checkpoint_sharded.py).

    python sharded_ckpt_job.py MODE DIRECTORY [ARGS]   (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set)

Every value of the state encodes its step and its global position, so a
loaded tensor can be checked for being exactly one step's, whatever layout
wrote it and whatever layout reads it.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

import stoker

ROWS, COLS = 37, 24        # "model.w": sharded by rows, unevenly
EMB = (16, 8)              # "model.emb": replicated
MOMENT_ROWS = 11           # "optimizer.m": sharded by rows too
LOOP_SCALE = 100           # the kill loop's "model.w" is 3700 x 2400 (35 MB): persists take a while


def rows_of(rank, world, rows):
    """The rows [begin, end) rank `rank` holds when `rows` are cut into `world` nearly equal parts."""
    base, extra = divmod(rows, world)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def cols_of(rank, world, cols):
    return rows_of(rank, world, cols)


_BASES = {}


def expected(name, step, shape):
    base = _BASES.get(tuple(shape))
    if base is None:
        count = 1
        for n in shape:
            count *= n
        base = _BASES[tuple(shape)] = torch.arange(count, dtype=torch.float64).reshape(shape)
    seed = {"model.w": 1, "model.emb": 2, "optimizer.m": 3}[name]
    return base + (step * 100000 + seed * 10000)


def state_for(step, rank, world, scale=1):
    rows, cols = ROWS * scale, COLS * scale
    w_begin, w_end = rows_of(rank, world, rows)
    m_begin, m_end = rows_of(rank, world, MOMENT_ROWS)
    w = expected("model.w", step, (rows, cols))[w_begin:w_end].float().contiguous()
    m = expected("optimizer.m", step, (MOMENT_ROWS, 3))[m_begin:m_end].double().contiguous()
    return {
        "model": {"w": stoker.Shard(w, (rows, cols), (w_begin, 0)),
                  "emb": expected("model.emb", step, EMB).float()},
        "optimizer": {"m": stoker.Shard(m, (MOMENT_ROWS, 3), (m_begin, 0)), "lr": 0.5 + step},
        "epoch": step // 10,
        # What torch.save kept and scripts save: the same on every rank, so written once.
        "args": argparse.Namespace(step=step), "keys": np.arange(6, dtype=np.uint32) + step, "best": np.float32(step),
    }


def check_extras(state, step):
    assert state["args"] == argparse.Namespace(step=step) and state["best"] == np.float32(step)
    assert state["keys"].dtype == np.uint32 and state["keys"].tolist() == list(range(step, step + 6))


def loop_expected(name, step, shape):
    """The kill loop's values: the base plus the step, advanced in place (exact in float32 below 2**24)."""
    seed = {"model.w": 1, "model.emb": 2, "optimizer.m": 3}[name]
    return expected(name, 0, shape) - seed * 10000 + seed * 1000 + step


class LoopState:
    """Made once, then advanced one step in place: saving is then most of the loop's time."""

    def __init__(self, step, rank, world):
        rows, cols = ROWS * LOOP_SCALE, COLS * LOOP_SCALE
        w_begin, w_end = rows_of(rank, world, rows)
        m_begin, m_end = rows_of(rank, world, MOMENT_ROWS)
        self.w = loop_expected("model.w", step, (rows, cols))[w_begin:w_end].float().contiguous()
        self.m = loop_expected("optimizer.m", step, (MOMENT_ROWS, 3))[m_begin:m_end].contiguous()
        self.emb = loop_expected("model.emb", step, EMB).float()
        self.step = step
        self.state = {"model": {"w": stoker.Shard(self.w, (rows, cols), (w_begin, 0)), "emb": self.emb},
                      "optimizer": {"m": stoker.Shard(self.m, (MOMENT_ROWS, 3), (m_begin, 0))}}

    def advance(self):
        for t in (self.w, self.m, self.emb):
            t.add_(1)
        self.step += 1


def check_loop(state, step):
    rows, cols = ROWS * LOOP_SCALE, COLS * LOOP_SCALE
    assert torch.equal(state["model"]["w"], loop_expected("model.w", step, (rows, cols)).float()), \
        "model.w of step %d differs" % step
    assert torch.equal(state["model"]["emb"], loop_expected("model.emb", step, EMB).float())
    assert torch.equal(state["optimizer"]["m"], loop_expected("optimizer.m", step, (MOMENT_ROWS, 3)))


def check_full(state, step, scale=1):
    """A state assembled whole (one process)."""
    assert torch.equal(state["model"]["w"], expected("model.w", step, (ROWS * scale, COLS * scale)).float()), \
        "model.w of step %d differs" % step
    assert torch.equal(state["model"]["emb"], expected("model.emb", step, EMB).float())
    assert torch.equal(state["optimizer"]["m"], expected("optimizer.m", step, (MOMENT_ROWS, 3)).double())
    assert state["optimizer"]["lr"] == 0.5 + step and state["epoch"] == step // 10
    check_extras(state, step)


def fsdp_expected(name, shape):
    count = 1
    for n in shape:
        count *= n
    return torch.arange(count, dtype=torch.float32).reshape(shape) * 0.001 + len(name)


def fsdp_model(world):
    """A small MLP whose every parameter has known values, sharded by FSDP2 over a CPU mesh of `world`."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    model = nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 11))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(fsdp_expected(name, tuple(p.shape)))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp1_model():
    """The same MLP wrapped by FSDP1 (FullyShardedDataParallel, flat parameters over the default group, on
    the CPU), each layer a unit of its own."""
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = nn.Sequential(nn.Linear(37, 64), nn.ReLU(), nn.Linear(64, 11))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(fsdp_expected(name, tuple(p.shape)))
    kw = dict(use_orig_params=True, device_id=torch.device("cpu"))  # without it FSDP1 asks for an accelerator
    model[0], model[2] = FSDP(model[0], **kw), FSDP(model[2], **kw)
    return FSDP(model, **kw)


def main():
    mode, directory = sys.argv[1], sys.argv[2]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {"rank": rank}
    if mode == "save":
        steps = [int(s) for s in sys.argv[3].split(",")]
        ckpt = stoker.Checkpointer(directory, keep_last=int(sys.argv[4]) if len(sys.argv) > 4 else 3)
        scale = int(sys.argv[5]) if len(sys.argv) > 5 else 1
        for step in steps:
            state = state_for(step, rank, world, scale=scale)
            assert ckpt.save(step, state)
            ckpt.wait()
        result["stats"] = ckpt.stats()
        ckpt.close()
    elif mode == "load":
        # This job's layout: model.w cut by columns (not rows), optimizer.m by rows over this world.
        c_begin, c_end = cols_of(rank, world, COLS)
        m_begin, m_end = rows_of(rank, world, MOMENT_ROWS)
        w = torch.full((ROWS, c_end - c_begin), -1.0)
        m = torch.full((m_end - m_begin, 3), -1.0, dtype=torch.float64)
        emb = torch.zeros(EMB)
        target = {"model": {"w": stoker.Shard(w, (ROWS, COLS), (0, c_begin)), "emb": emb},
                  "optimizer": {"m": stoker.Shard(m, (MOMENT_ROWS, 3), (m_begin, 0))}}
        loaded = stoker.load_latest(directory, target=target)
        step = loaded.step
        assert torch.equal(w, expected("model.w", step, (ROWS, COLS))[:, c_begin:c_end].float())
        assert torch.equal(m, expected("optimizer.m", step, (MOMENT_ROWS, 3))[m_begin:m_end])
        assert torch.equal(emb, expected("model.emb", step, EMB).float())
        assert loaded.state["model"]["w"].tensor is w and loaded.state["optimizer"]["lr"] == 0.5 + step
        check_extras(loaded.state, step)  # not in the target: assembled whole
        result["step"] = step
        result["loader_rank"] = loaded.extra if isinstance(loaded.extra, dict) else None
    elif mode == "disagree":
        ckpt = stoker.Checkpointer(directory)
        try:
            ckpt.save(5 + rank, state_for(5, rank, world))
            result["error"] = None
        except ValueError as e:
            result["error"] = str(e)
        ckpt.close()
    elif mode == "skip":
        # when_busy="skip": one rank still persisting makes every rank skip (rank 2 says it is busy).
        ckpt = stoker.Checkpointer(directory, when_busy="skip")

        class Busy:
            def __init__(self, inner):
                self.inner = inner

            def busy(self):
                return True

            def __getattr__(self, name):
                return getattr(self.inner, name)

        real = ckpt._native
        if rank == 2:
            ckpt._native = Busy(real)
        result["first"] = ckpt.save(1, state_for(1, rank, world))
        ckpt._native = real
        result["second"] = ckpt.save(2, state_for(2, rank, world))
        ckpt.wait()
        result["skipped"] = ckpt.stats()["skipped_busy"]
        ckpt.close()
    elif mode == "fail":
        # Step 1 cannot be committed (rank 2's piece of model.w is misplaced: a gap); the others
        # hear of it from rank 0 at once, the next save is skipped everywhere while rank 0 reports
        # its error, and step 3 goes through.
        ckpt = stoker.Checkpointer(directory, commit_timeout=120)
        bad = state_for(1, rank, world)
        if rank == 2:
            shard = bad["model"]["w"]
            bad["model"]["w"] = stoker.Shard(shard.tensor[:-1], shard.global_shape, shard.offsets)
        started = time.monotonic()
        assert ckpt.save(1, bad)
        if rank != 0:
            try:
                ckpt.wait()
                result["wait_error"] = None
            except stoker.StokerError as e:
                result["wait_error"] = str(e)
            result["wait_s"] = time.monotonic() - started
        try:
            result["second"] = ckpt.save(2, state_for(2, rank, world))
            result["save_error"] = None
        except Exception as e:
            result["second"] = None
            result["save_error"] = "%s: %s" % (type(e).__name__, e)
        assert ckpt.save(3, state_for(3, rank, world))
        ckpt.wait()
        ckpt.close()
    elif mode == "alone":
        # The old single-writer pattern under an initialised group: rank 0 alone constructs it.
        if rank == 0:
            started = time.monotonic()
            try:
                stoker.Checkpointer(directory, commit_timeout=2)
                result["error"] = None
            except stoker.StokerError as e:
                result["error"] = str(e)
            result["seconds"] = time.monotonic() - started
            with stoker.Checkpointer(directory, group=None) as ckpt:  # what the error says to do
                ckpt.save(1, {"w": torch.ones(3)})
    elif mode == "due":
        # Time-based intervals: every rank gets rank 0's answer, asked every 50 steps.
        ckpt = stoker.Checkpointer(directory, every_seconds=0.05 if rank == 0 else 1e6)
        due = []
        for step in range(1, 160):
            if ckpt.due(step):
                due.append(step)
                ckpt.save(step, state_for(step, rank, world))
            time.sleep(0.002)
        ckpt.wait()
        result["due"] = due
        ckpt.close()
    elif mode == "loop":
        # Saves as fast as it can until killed; a larger state so that kills land inside persists.
        ckpt = stoker.Checkpointer(directory, keep_last=2, commit_timeout=30)
        loop = LoopState(int(sys.argv[3]), rank, world)
        while True:
            ckpt.save(loop.step, loop.state)
            ckpt.wait()
            loop.advance()
    elif mode == "peer_save":
        # replicate_to_peer: machine r's memory is the folder MEMORY/machine-r.
        steps, memory = [int(s) for s in sys.argv[3].split(",")], sys.argv[4]
        fail_rank, fail_step = map(int, sys.argv[5].split(":")) if len(sys.argv) > 5 else (-1, -1)
        if rank == fail_rank:  # this rank's memory is full when it copies step fail_step
            import errno
            from stoker import _peer_copy
            real_file = _peer_copy._File

            def full_at_fail_step(path, size):
                if "-step%d-" % fail_step in os.path.basename(path):
                    raise OSError(errno.ENOSPC, "No space left on device")
                return real_file(path, size)
            _peer_copy._File = full_at_fail_step
        ckpt = stoker.Checkpointer(directory, replicate_to_peer=True,
                                   peer_memory_dir=os.path.join(memory, "machine-%d" % rank))
        for step in steps:
            assert ckpt.save(step, state_for(step, rank, world), extra={"rank": rank, "step": step})
            ckpt.wait()
        result["stats"] = {k: v for k, v in ckpt.stats().items() if k.startswith(("peer", "last_peer"))}
        ckpt.close()
    elif mode == "peer_load":
        # Rank r of this job runs on machine MACHINES[r]; model.w cut by columns, as "load" does.
        memory, machines = sys.argv[3], sys.argv[4].split(",")
        if len(sys.argv) > 5:  # blocks this large travel on their own, into their targets where contiguous
            from stoker import _peer_restore
            _peer_restore._DIRECT_BYTES = int(sys.argv[5])
        c_begin, c_end = cols_of(rank, world, COLS)
        w = torch.full((ROWS, c_end - c_begin), -1.0)
        emb = torch.zeros(EMB)
        target = {"model": {"w": stoker.Shard(w, (ROWS, COLS), (0, c_begin)), "emb": emb}}
        loaded = stoker.load_latest(directory, target=target, from_peers=True,
                                    memory_dir=os.path.join(memory, "machine-%s" % machines[rank]))
        step = loaded.step
        assert torch.equal(w, expected("model.w", step, (ROWS, COLS))[:, c_begin:c_end].float())
        assert torch.equal(emb, expected("model.emb", step, EMB).float())
        # Not in the target: assembled whole from the pieces, as the saved structure names it.
        assert torch.equal(loaded.state["optimizer"]["m"], expected("optimizer.m", step, (MOMENT_ROWS, 3)))
        assert loaded.state["model"]["w"].tensor is w and loaded.state["optimizer"]["lr"] == 0.5 + step
        check_extras(loaded.state, step)  # not in the target: assembled whole
        assert loaded.state["epoch"] == step // 10
        result.update(step=step, path=loaded.path, extra=loaded.extra, rng=sorted(loaded.rng_states))
    elif mode == "peer_loop":
        # Saves with copies on peers as fast as it can until killed (the kill loop's larger state).
        ckpt = stoker.Checkpointer(directory, keep_last=2, commit_timeout=30, replicate_to_peer=True,
                                   peer_memory_dir=os.path.join(sys.argv[4], "machine-%d" % rank))
        loop = LoopState(int(sys.argv[3]), rank, world)
        while True:
            ckpt.save(loop.step, loop.state)
            ckpt.wait()
            loop.advance()
    elif mode == "peer_loop_load":
        rows, cols = ROWS * LOOP_SCALE, COLS * LOOP_SCALE
        target = {"model": {"w": torch.empty(rows, cols), "emb": torch.empty(EMB)},
                  "optimizer": {"m": torch.empty(MOMENT_ROWS, 3, dtype=torch.float64)}}
        loaded = stoker.load_latest(directory, target=target, from_peers=True,
                                    memory_dir=os.path.join(sys.argv[3], "machine-%d" % rank))
        check_loop(loaded.state, loaded.step)
        result.update(step=loaded.step, path=loaded.path)
    elif mode in ("fsdp_save", "fsdp_load"):
        # FSDP2 (torch >= 2.4): its state_dict() holds DTensors sharded over this world; saved, then
        # loaded into another world's FSDP2 model in place, from storage or from the peers' memory.
        model = fsdp_model(world)
        memory = os.path.join(sys.argv[3], "machine-%d" % rank)
        if mode == "fsdp_save":
            ckpt = stoker.Checkpointer(directory, replicate_to_peer=True, peer_memory_dir=memory)
            assert ckpt.save(7, {"model": model.state_dict()})
            ckpt.wait()
            ckpt.close()
        else:
            state = model.state_dict()
            for value in state.values():
                value.to_local().zero_()
            loaded = stoker.load_latest(directory, target={"model": state}, from_peers=sys.argv[4] == "peers",
                                        memory_dir=memory)
            assert loaded is not None, "no checkpoint in storage or in memory"
            for name, value in model.state_dict().items():
                assert torch.equal(value.full_tensor(), fsdp_expected(name, tuple(value.shape))), name
            result.update(step=loaded.step, path=loaded.path,
                          local_shapes={k: list(v.to_local().shape) for k, v in state.items()})
    elif mode in ("fsdp1_save", "fsdp1_load"):
        # FSDP1's SHARDED_STATE_DICT: ShardedTensors (or DTensors, as the torch has it) over this world.
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
        model = fsdp1_model()
        with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
            state = model.state_dict()
            if mode == "fsdp1_save":
                ckpt = stoker.Checkpointer(directory)
                assert ckpt.save(7, {"model": state})
                ckpt.wait()
                ckpt.close()
            else:
                for value in state.values():
                    local = value.to_local() if hasattr(value, "to_local") else value.local_tensor()
                    local.zero_()
                loaded = stoker.load_latest(directory, target={"model": state})
                model.load_state_dict(state)
                result.update(step=loaded.step, kinds=sorted({type(v).__name__ for v in state.values()}))
        if mode == "fsdp1_load":
            with FSDP.summon_full_params(model):
                for name, value in model.named_parameters():
                    name = name.replace("_fsdp_wrapped_module.", "")
                    assert torch.equal(value, fsdp_expected(name, tuple(value.shape))), name
    dist.barrier()
    with open(os.path.join(os.environ["RESULT_DIR"], "result-%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
