"""FSDP2 state (DTensors), and FSDP1 sharded state dicts, through sharded checkpoints, where torch has it
(torch >= 2.4; skipped on Debian's 1.13, run by scripts/gpu-check's
ckpt_sharded part on torch 2.x): saved by 3 ranks, loaded in place into a
2-rank FSDP2 model's state_dict(), from storage and from the peers' memory."""
import pathlib
import shutil
import sys

import pytest

torch = pytest.importorskip("torch")
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except Exception:  # ImportError; torch 1.13's fsdp package fails to import on Python 3.11 (ValueError)
    try:
        from torch.distributed._composable.fsdp import fully_shard  # noqa: F401
    except Exception:
        pytest.skip("this torch (%s) has no FSDP2 (fully_shard)" % torch.__version__, allow_module_level=True)

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from sharded_harness import run  # noqa: E402


def test_fsdp2_state_reshards_in_place_from_storage_and_from_peers(tmp_path):
    ckpt, memory = tmp_path / "ckpt", tmp_path / "memory"
    run(3, "fsdp_save", ckpt, memory, results=tmp_path / "r1")
    loaded = run(2, "fsdp_load", ckpt, memory, "storage", results=tmp_path / "r2")
    assert [r["step"] for r in loaded] == [7, 7] and loaded[0]["path"].endswith("step-7")
    assert loaded[0]["local_shapes"]["0.weight"] == [32, 37]  # this world's shard, filled in place
    # Machine 1 lost (its pieces are on its peer, machine 2, too); the new job's rank 1 runs on machine 2.
    shutil.rmtree(memory / "machine-1")
    (memory / "machine-2").rename(memory / "machine-1")
    shutil.move(str(ckpt), str(tmp_path / "elsewhere"))
    loaded = run(2, "fsdp_load", ckpt, memory, "peers", results=tmp_path / "r3")
    assert [r["step"] for r in loaded] == [7, 7] and loaded[0]["path"].startswith("memory:")


def test_fsdp1_sharded_state_dict_reshards_in_place(tmp_path):
    """FSDP1 (FullyShardedDataParallel) with StateDictType.SHARDED_STATE_DICT: saved by 3 ranks, loaded
    in place into a 2-rank FSDP1 model's sharded state, then load_state_dict(); the full parameters are
    the saved ones."""
    ckpt = tmp_path / "ckpt"
    run(3, "fsdp1_save", ckpt, results=tmp_path / "r1")
    loaded = run(2, "fsdp1_load", ckpt, results=tmp_path / "r2")
    assert [r["step"] for r in loaded] == [7, 7]
    assert loaded[0]["kinds"] in (["ShardedTensor"], ["DTensor"]), loaded[0]["kinds"]  # sharded, not gathered
