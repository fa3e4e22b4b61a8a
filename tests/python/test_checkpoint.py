"""Checkpoints from Python: nested torch state round trips, interoperability
with the real safetensors library both ways (every dtype), loader and RNG
state, retention, busy policy, corruption, and a SIGKILLed training script."""
import collections
import ctypes
import json
import math
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import safetensors
import safetensors.torch
import torch

import stoker
from stoker import _native


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 6 * 6, 5))


def train_steps(model, optimizer, steps, seed):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 3, 8, 8, generator=gen)
        y = torch.randint(0, 5, (8,), generator=gen)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()


def test_nested_state_round_trips_and_training_resumes_identically(tmp_path):
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    train_steps(model, optimizer, 3, seed=1)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 3, "lr": 0.1,
             "nan": float("nan"), "pair": (1, "two"), "none": None, "half": torch.arange(6, dtype=torch.bfloat16),
             "flags": torch.tensor([True, False]), "scalar": torch.tensor(2.5, dtype=torch.float64),
             "strided": torch.arange(12.0).reshape(3, 4).t(), "empty": torch.zeros(0, 3)}
    with stoker.Checkpointer(tmp_path) as ckpt:
        assert ckpt.save(3, state, extra={"run": "a"}) is True
        ckpt.wait()
    restored = stoker.load_latest(tmp_path)
    assert restored.step == 3 and restored.extra == {"run": "a"} and restored.skipped == []
    s = restored.state
    assert isinstance(s["model"], collections.OrderedDict)
    assert list(s["model"].keys()) == list(model.state_dict().keys())
    for k, v in model.state_dict().items():
        assert torch.equal(v, s["model"][k]) and v.dtype == s["model"][k].dtype, k
    assert set(s["optimizer"]["state"].keys()) == {0, 1, 2, 3, 4, 5}  # int keys kept
    assert s["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)  # tuples kept
    assert s["step"] == 3 and s["lr"] == 0.1 and math.isnan(s["nan"]) and s["pair"] == (1, "two") and s["none"] is None
    assert torch.equal(s["half"], state["half"]) and s["half"].dtype == torch.bfloat16
    assert torch.equal(s["flags"], state["flags"]) and s["flags"].dtype == torch.bool
    assert s["scalar"].shape == () and s["scalar"].item() == 2.5
    assert torch.equal(s["strided"], state["strided"])
    assert s["empty"].shape == (0, 3)

    # A fresh model and optimizer restored from the checkpoint train exactly as the original goes on.
    model2 = make_model()
    optimizer2 = torch.optim.AdamW(model2.parameters(), lr=1e-2)
    model2.load_state_dict(s["model"])
    optimizer2.load_state_dict(s["optimizer"])
    train_steps(model, optimizer, 2, seed=2)
    train_steps(model2, optimizer2, 2, seed=2)
    for a, b in zip(model.state_dict().values(), model2.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_tensors_are_snapshotted_when_save_returns(tmp_path):
    w = torch.ones(1000)
    with stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"w": w})
        w.fill_(-1)  # training goes on while the persist runs
    assert torch.equal(stoker.load_latest(tmp_path).state["w"], torch.ones(1000))


def test_files_load_in_the_real_safetensors_library(tmp_path):
    state = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(4).to(torch.bfloat16),
             "d": torch.tensor([True, False, True]), "e": torch.randn(2, 2, dtype=torch.float16)}
    with stoker.Checkpointer(tmp_path, max_file_size=100) as ckpt:  # forces several files and an index
        ckpt.save(1, state)
    step = tmp_path / "step-1"
    index = json.loads((step / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in state.values())
    loaded = {}
    for name in sorted(set(index["weight_map"].values())):
        part = safetensors.torch.load_file(str(step / name))
        assert all(index["weight_map"][k] == name for k in part)
        loaded.update(part)
    assert loaded.keys() == state.keys()
    for k in state:
        assert torch.equal(loaded[k], state[k]) and loaded[k].dtype == state[k].dtype, k


ALL_DTYPES = ["BOOL", "U8", "I8", "I16", "U16", "I32", "U32", "I64", "U64", "F16", "BF16", "F32", "F64", "C64",
              "F8_E4M3", "F8_E4M3FNUZ", "F8_E5M2", "F8_E5M2FNUZ", "F8_E8M0"]
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8, "F16": 2, "BF16": 2,
         "F32": 4, "F64": 8, "C64": 8}


def test_every_dtype_both_ways_with_safetensors_raw_api(tmp_path):
    rng = random.Random(7)
    raw = {}
    for i, dtype in enumerate(ALL_DTYPES):
        shape = [2, 3] if i % 2 else [5]
        n = math.prod(shape) * SIZES.get(dtype, 1)
        data = bytes(rng.randrange(0, 2 if dtype == "BOOL" else 256) for _ in range(n))
        raw["t_" + dtype] = (dtype, shape, data)
    # stoker writes (through the native API, since torch 1.13 has no float8) ...
    buffers = {name: ctypes.create_string_buffer(data, len(data)) for name, (_, _, data) in raw.items()}
    flat = [(name, dtype, shape, ctypes.addressof(buffers[name]), -1) for name, (dtype, shape, _) in raw.items()]
    ckpt = _native.Checkpointer(str(tmp_path / "ours"), 3, 0, False, "wait", 1 << 30, "steps", 1000, 60.0, 3600.0, 0,
                                False)
    assert ckpt.save(0, _native.FlatState(flat), None, {}, {"k": "v"}, None, None)
    ckpt.wait()
    ckpt.close()
    # ... and safetensors reads every tensor back, with its dtype and bytes.
    blob = (tmp_path / "ours" / "step-0" / "model.safetensors").read_bytes()
    got = {name: spec for name, spec in safetensors.deserialize(blob)}
    assert got.keys() == raw.keys()
    for name, (dtype, shape, data) in raw.items():
        assert got[name]["dtype"] == dtype and list(got[name]["shape"]) == shape and bytes(got[name]["data"]) == data
    header_len = int.from_bytes(blob[:8], "little")
    assert header_len % 8 == 0 and blob[8:9] == b"{"
    assert json.loads(blob[8:8 + header_len])["__metadata__"] == {"k": "v", "format": "pt"}

    # The other way: safetensors writes every dtype, stoker reads it (validating).
    torch_names = {"F32": "float32", "F64": "float64", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
                   "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "U16": "uint16",
                   "U32": "uint32", "U64": "uint64", "C64": "complex64", "F8_E4M3": "float8_e4m3fn",
                   "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2": "float8_e5m2", "F8_E5M2FNUZ": "float8_e5m2fnuz",
                   "F8_E8M0": "float8_e8m0fnu"}
    specs = {name: safetensors.TensorSpec(dtype=torch_names[dtype], shape=shape, data_ptr=ctypes.addressof(buffers[name]),
                                          data_len=len(data))
             for name, (dtype, shape, data) in raw.items()}
    theirs = tmp_path / "theirs.safetensors"
    theirs.write_bytes(safetensors.serialize(specs, metadata={"from": "safetensors"}))
    loaded = _native.load_safetensors(str(theirs))
    assert loaded["metadata"] == {"from": "safetensors"}
    from torch.utils.dlpack import from_dlpack
    seen = {}
    for dtype, capsule, names, shapes, numels in loaded["runs"]:  # uint8 over consecutive tensors of one dtype
        data = bytes(from_dlpack(capsule).numpy())
        for name, shape, numel in zip(names, shapes, numels):
            size = numel * SIZES.get(dtype, 1)
            seen[name], data = (dtype, list(shape), data[:size]), data[size:]
        assert data == b""
    assert seen == raw


def test_torch_files_from_safetensors_load_in_stoker(tmp_path):
    tensors = {"w": torch.randn(4, 4), "b": torch.arange(3, dtype=torch.int32), "h": torch.randn(5).to(torch.bfloat16)}
    path = tmp_path / "hf.safetensors"
    safetensors.torch.save_file(tensors, str(path), metadata={"format": "pt"})
    loaded = stoker.load_safetensors(path)
    assert loaded.keys() == tensors.keys()
    for k in tensors:
        assert torch.equal(loaded[k], tensors[k]) and loaded[k].dtype == tensors[k].dtype
    loaded["w"].add_(1)  # copy-on-write: the file stays as it was
    assert torch.equal(safetensors.torch.load_file(str(path))["w"], tensors["w"])


def test_invalid_safetensors_is_a_clear_corruption_error(tmp_path):
    path = tmp_path / "bad.safetensors"
    header = b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(12))
    with pytest.raises(stoker.CorruptionError, match=r"bad.safetensors.*needs 8 bytes"):
        stoker.load_safetensors(path)


def test_loader_state_and_rng_resume_exactly(cli, demo_images, tmp_path):
    packed = tmp_path / "packed"
    cli("pack", demo_images, packed, "--shard-size", "1MiB")
    loader = stoker.Loader(packed, batch_size=4, seed=5, with_indices=True, num_threads=2,
                           transform=stoker.transforms.Compose([stoker.transforms.RandomResizedCrop(32)]))
    it = iter(loader)
    for _ in range(3):
        next(it)
    torch.manual_seed(11)
    random.seed(12)
    with stoker.Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(3, {"w": torch.zeros(2)}, loader=loader)
    expected_batch = next(it)[2].tolist()
    expected_rng = (torch.rand(3), random.random())

    restored = stoker.load_latest(tmp_path / "ckpt")
    assert restored.loader_state["batches_consumed"] == 3
    resumed = stoker.Loader(packed, batch_size=4, seed=5, with_indices=True, num_threads=1,
                            transform=stoker.transforms.Compose([stoker.transforms.RandomResizedCrop(32)]))
    resumed.load_state_dict(restored.loader_state)
    assert next(iter(resumed))[2].tolist() == expected_batch
    torch.manual_seed(999)
    random.seed(999)
    stoker.restore_rng(restored)
    assert torch.equal(torch.rand(3), expected_rng[0]) and random.random() == expected_rng[1]


def test_retention_keeps_last_and_best(tmp_path):
    accuracy = [0.5, 0.9, 0.6, 0.7, 0.65]
    with stoker.Checkpointer(tmp_path, keep_last=2, keep_best=1, metric_mode="max") as ckpt:
        for step, acc in enumerate(accuracy):
            ckpt.save(step, {"w": torch.full((10,), float(step))}, metric=acc)
            ckpt.wait()
    assert [c["step"] for c in stoker.list_checkpoints(tmp_path)] == [1, 3, 4]
    assert (tmp_path / "latest").read_text() == "step-4\n"


def test_skip_when_busy_and_interval(tmp_path):
    big = {"w": torch.zeros(8 << 20)}  # 32 MiB: the persist outlasts the next call
    with stoker.Checkpointer(tmp_path, when_busy="skip", every_steps=10) as ckpt:
        assert ckpt.due(0) and not ckpt.due(5) and ckpt.due(20)
        started = [ckpt.save(i, big) for i in range(4)]
        ckpt.wait()
        stats = ckpt.stats()
    assert started[0] is True and False in started
    assert stats["skipped_busy"] == started.count(False)
    assert stats["saves_published"] == started.count(True)
    auto = stoker.Checkpointer(tmp_path / "auto", mtbf_hours=24, every_seconds=600)
    auto.save(0, big)
    auto.wait()
    s = auto.stats()
    auto.close()
    expected = max(math.sqrt(2 * s["last_stall_s"] * 24 * 3600), s["last_persist_s"])
    assert s["interval_s"] == pytest.approx(expected, rel=1e-6)
    assert 0 < s["expected_overhead"] < 1


def test_corrupt_newest_is_named_or_skipped(tmp_path):
    with stoker.Checkpointer(tmp_path, keep_last=0) as ckpt:
        for step in (1, 2):
            ckpt.save(step, {"w": torch.full((100,), float(step))})
            ckpt.wait()
    path = tmp_path / "step-2" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(stoker.CorruptionError, match=r"step-2/model.safetensors' fails its xxh3 checksum"):
        stoker.load_latest(tmp_path)
    fallback = stoker.load_latest(tmp_path, skip_corrupt=True)
    assert fallback.step == 1 and torch.equal(fallback.state["w"], torch.full((100,), 1.0))
    assert "step-2" in fallback.skipped[0]
    assert stoker.load_latest(tmp_path / "empty") is None


def test_bad_state_and_options_raise_clear_errors(tmp_path):
    with stoker.Checkpointer(tmp_path) as ckpt:
        with pytest.raises(TypeError, match=r"cannot checkpoint 'object' at 'model.odd'"):
            ckpt.save(0, {"model": {"odd": object()}})
        with pytest.raises(ValueError, match=r"duplicate tensor name 'a.b'"):
            ckpt.save(0, {"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}})
        with pytest.raises(TypeError, match="JSON"):
            ckpt.save(0, {"w": torch.zeros(1)}, extra={"x": object()})
        with pytest.raises(stoker.StokerError, match="another process is writing checkpoints"):
            stoker.Checkpointer(tmp_path)
    with pytest.raises(ValueError, match="when_busy"):
        stoker.Checkpointer(tmp_path, when_busy="later")
    with pytest.raises(ValueError, match="4 parsecs"):
        stoker.Checkpointer(tmp_path, max_file_size="4 parsecs")


TRAIN_SCRIPT = r"""
import sys, torch, stoker
ckpt = stoker.Checkpointer(sys.argv[1], keep_last=2, max_file_size="3MB")
restored = ckpt.load_latest()
step = 0 if restored is None else restored.step + 1
while True:
    ckpt.save(step, {"w": torch.full((1 << 20,), float(step)), "step": step})
    ckpt.wait()
    step += 1
"""


def test_sigkilled_training_script_always_leaves_a_loadable_checkpoint(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    rng = random.Random(3)
    last = -1
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpt")], env=os.environ.copy())
        # torch's import takes a while; wait for the first checkpoint of this run, then kill at a random moment.
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            ckpts = stoker.list_checkpoints(tmp_path / "ckpt") if (tmp_path / "ckpt").exists() else []
            if ckpts and ckpts[-1]["step"] > last:
                break
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        restored = stoker.load_latest(tmp_path / "ckpt")
        assert restored is not None and restored.step >= last
        assert restored.state["step"] == restored.step
        assert torch.equal(restored.state["w"], torch.full((1 << 20,), float(restored.step)))
        last = restored.step


def test_cli_lists_and_verifies_checkpoints(cli, tmp_path):
    with stoker.Checkpointer(tmp_path, keep_last=0) as ckpt:
        for step in (10, 20):
            ckpt.save(step, {"w": torch.full((1000,), float(step))}, metric=step / 100)
            ckpt.wait()
    listed = [json.loads(line) for line in cli("checkpoint", "ls", tmp_path, "--json").stdout.splitlines()]
    assert [c["step"] for c in listed] == [10, 20] and listed[1]["metric"] == 0.2
    assert "step         20" in cli("checkpoint", "ls", tmp_path).stdout
    assert cli("checkpoint", "verify", tmp_path).stdout.count("ok ") == 2
    path = tmp_path / "step-20" / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    result = cli("checkpoint", "verify", tmp_path, check=False)
    assert result.returncode == 1
    assert "CORRUPT  %s" % (tmp_path / "step-20") in result.stdout and "fails its xxh3 checksum" in result.stdout
    assert cli("checkpoint", "verify", tmp_path / "step-10").returncode == 0
    missing = cli("checkpoint", "verify", tmp_path / "nothing", check=False)
    assert missing.returncode == 1 and "cannot list" in missing.stderr
