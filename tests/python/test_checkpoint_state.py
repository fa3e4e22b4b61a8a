"""The native flattening of a training state for Checkpointer.save(): the
structure and names it writes match the format's reference (the Python
implementation it replaced, kept here as the oracle), what cannot be saved is
refused naming its path, and the FlatState reused from save to save keeps no
tensor alive and mixes nothing between saves."""
import collections
import enum
import gc
import json
import math
import threading
import weakref

import pytest
import torch

import stoker
from stoker import checkpoint as sc


def reference_structure(obj, path="", names=None):
    """The structure format of docs/checkpoint.md as the Python package wrote
    it before the native pass: the oracle the native output must match."""
    names = [] if names is None else names
    if torch.is_tensor(obj):
        names.append(path or "tensor")
        return {"t": path or "tensor"}
    if isinstance(obj, dict):
        items = []
        for key, value in obj.items():
            child = "%s.%s" % (path, key) if path else str(key)
            items.append([key, reference_structure(value, child, names)])
        return {"d": items, "o": isinstance(obj, collections.OrderedDict)}
    if isinstance(obj, (list, tuple)):
        nodes = [reference_structure(v, "%s.%d" % (path, i) if path else str(i), names) for i, v in enumerate(obj)]
        return {"l" if isinstance(obj, list) else "u": nodes}
    if obj is None or isinstance(obj, (bool, int, str)):
        return {"v": obj}
    return {"f": obj.hex()}


def tricky_state():
    ordered = collections.OrderedDict([("first", torch.zeros(2)), ("second", torch.ones(3)), ("third", 3)])
    ordered.move_to_end("first")  # its own order, not the dict's insertion order
    return {
        "model": ordered,
        "optimizer": {"state": {0: {"step": torch.tensor(4.0), "exp_avg": torch.randn(2, 3)},
                                -7: {"exp_avg": torch.randn(1)}, 2 ** 70: {"big": torch.arange(3)}},
                      "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "amsgrad": False, "eps": None,
                                        "params": [0, -7]}]},
        "floats": [float("nan"), float("inf"), -0.0, 5e-324, 1.0 / 3],
        "strings": ["quote \" back \\ slash", "tab\tnew\nline\x01", "caf\u00e9 \U0001F600", ""],
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "strided": torch.arange(12.0).reshape(3, 4).t(),
        "nested": [(), [[]], {}, ({"x": (torch.zeros(0),)},)],
        "ints": [0, -1, 2 ** 63 - 1, -(2 ** 63), 2 ** 64, -(2 ** 100), True, False],
    }


def test_structure_and_names_match_the_reference():
    for state in (tricky_state(), {}, [], torch.ones(3), {"a": {"b": {"c": [torch.ones(1)] * 3}}}):
        flat = sc.flatten(state)
        names = []
        expected = reference_structure(state, "", names)
        assert json.loads(flat.structure) == json.loads(json.dumps(expected))
        assert flat.names == names
        assert flat.tensor_count == len(names)
        assert flat.devices == []


def test_tricky_state_round_trips(tmp_path):
    state = tricky_state()
    with stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
    s = stoker.load_latest(tmp_path).state
    assert list(s["model"].keys()) == ["second", "third", "first"] and isinstance(s["model"], collections.OrderedDict)
    assert set(s["optimizer"]["state"]) == {0, -7, 2 ** 70}
    assert torch.equal(s["optimizer"]["state"][2 ** 70]["big"], torch.arange(3))
    assert s["optimizer"]["param_groups"][0]["betas"] == (0.9, 0.999)
    f = s["floats"]
    assert math.isnan(f[0]) and f[1] == math.inf and math.copysign(1, f[2]) == -1 and f[3] == 5e-324 and f[4] == 1 / 3
    assert s["strings"] == state["strings"]
    assert torch.equal(s["param"], state["param"].detach()) and torch.equal(s["strided"], state["strided"])
    assert s["nested"] == [(), [[]], {}, ({"x": (s["nested"][3][0]["x"][0],)},)]
    assert s["nested"][3][0]["x"][0].shape == (0,)
    assert s["ints"][:6] == state["ints"][:6] and s["ints"][6] is True and s["ints"][7] is False


def test_int_enum_keys_and_values_are_their_numbers(tmp_path):
    class Color(enum.IntEnum):
        RED = 1

    with stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"by": {Color.RED: torch.ones(1)}, "value": Color.RED})
    loaded = stoker.load_latest(tmp_path)
    assert list(loaded.state["by"].keys()) == [1] and loaded.state["value"] == 1
    assert "by.1" in sc.flatten({"by": {Color.RED: torch.ones(1)}}).names


def test_a_lazily_conjugated_tensor_is_saved_resolved(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    assert z.is_conj()
    with stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, {"z": z})
    assert torch.equal(stoker.load_latest(tmp_path).state["z"], z.resolve_conj())


def test_what_cannot_be_saved_is_refused_naming_its_path(tmp_path):
    cases = [
        ({"opt": {(1, 2): torch.ones(1)}}, TypeError, r"state key \(1, 2\) at 'opt' is not a str or int"),
        ({"opt": {True: torch.ones(1)}}, TypeError, r"state key True at 'opt' is not a str or int"),
        ({"model": {"odd": object()}}, TypeError, r"cannot checkpoint 'object' at 'model.odd'"),
        ({"m": [torch.randn(3, 3).to_sparse()]}, TypeError, r"tensor 'm.0' has layout torch.sparse_coo"),
        ({"m": {"q": torch.quantize_per_tensor(torch.randn(2), 0.1, 0, torch.qint8)}}, TypeError,
         r"tensor 'm.q' has dtype torch.qint8, which safetensors cannot store"),
        ({"meta": torch.empty(3, device="meta")}, NotImplementedError, r"tensor 'meta': "),
    ]
    loop = []
    loop.append(loop)
    cases.append(({"loop": loop}, ValueError, r"nests deeper than 1000 levels at 'loop\.0\.0"))
    with stoker.Checkpointer(tmp_path) as ckpt:
        for state, error, message in cases:
            with pytest.raises(error, match=message):
                ckpt.save(1, state)
        with pytest.raises(ValueError, match=r"duplicate tensor name 'a.b'"):
            ckpt.save(1, {"a.b": torch.zeros(1), "a": {"b": torch.zeros(1)}})
        # Nothing was saved, and the Checkpointer still works.
        assert ckpt.save(2, {"w": torch.ones(2)})
    assert stoker.load_latest(tmp_path).step == 2


def test_what_torch_save_kept_and_scripts_save_round_trips(tmp_path):
    # torchvision's reference scripts save "args": args; resume code saves np.random.get_state() and NumPy metrics.
    # Each was a TypeError before; each comes back as its own type, without pickle.
    import argparse
    import pathlib
    import random

    import numpy as np
    arrays = {np.dtype(dt).name: (np.arange(12) % 2).astype(dt).reshape(3, 4) for dt in (
        np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64, np.float16,
        np.float32, np.float64, np.complex64, np.complex128)}
    arrays["big_endian"] = np.arange(5, dtype=">f8")
    arrays["strided"] = np.arange(20, dtype=np.int32).reshape(4, 5)[:, ::2]
    arrays["fortran"] = np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    arrays["zero_d"], arrays["empty"] = np.array(2.5), np.zeros((0, 3), np.float32)
    readonly = np.arange(4, dtype=np.int64)
    readonly.flags.writeable = False
    arrays["readonly"] = readonly
    state = {"args": argparse.Namespace(lr=0.1, out=pathlib.Path("/runs/a"), sizes=[1, 2], amp=False),
             "rng": {"numpy": np.random.get_state(), "python": random.getstate()}, "arrays": arrays,
             "scalars": [np.float32(0.25), np.int64(-3), np.uint64(2 ** 64 - 1), np.bool_(True), np.float16(1.5)],
             "blobs": [b"\x00ab", bytearray(b"cd"), b""], "paths": [pathlib.PurePosixPath("x/y")],
             "torch": [torch.bfloat16, torch.device("cuda", 1), torch.device("cpu")]}
    with stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(1, state)
    s = stoker.load_latest(tmp_path).state
    assert s["args"] == state["args"] and isinstance(s["args"].out, pathlib.Path)
    assert s["rng"]["python"] == state["rng"]["python"]
    np.random.set_state(s["rng"]["numpy"])
    after_load = np.random.rand(3)
    np.random.set_state(state["rng"]["numpy"])
    assert np.array_equal(after_load, np.random.rand(3))
    for name, a in arrays.items():
        got = s["arrays"][name]
        assert isinstance(got, np.ndarray) and got.shape == a.shape and np.array_equal(got, a), name
        assert got.dtype == a.dtype.newbyteorder("="), name
    for got, want in zip(s["scalars"], state["scalars"], strict=True):
        assert type(got) is type(want) and got == want
    assert s["blobs"] == state["blobs"] and type(s["blobs"][1]) is bytearray
    assert s["paths"] == state["paths"] and type(s["paths"][0]) is pathlib.PurePosixPath
    assert s["torch"] == state["torch"]
    # Tensors of its bytes, named by their path: a safetensors reader sees them as uint8.
    assert "arrays.uint32" in sc.flatten(state).names
    # What still cannot be saved without pickle is refused, naming it.
    with stoker.Checkpointer(tmp_path / "refused") as ckpt:
        for value, kind in [(np.array([object()]), "ndarray"), (np.array(["a"]), "ndarray"),
                            (np.longdouble(1), "longdouble|float128"), ({1, 2}, "set")]:
            with pytest.raises(TypeError, match=r"cannot checkpoint '.*(%s)' at 'x'" % kind):
                ckpt.save(1, {"x": value})


def test_a_value_tagged_by_a_newer_stoker_is_a_corruption_error():
    with pytest.raises(stoker.CorruptionError, match="tagged 'quaternion'"):
        sc._unflatten({"x": "quaternion", "n": {"v": 1}}, {})
    with pytest.raises(stoker.CorruptionError, match="torch dtype 'float99'"):
        sc._unflatten({"x": "torch.dtype", "n": {"v": "float99"}}, {})


class Annealer:
    def anneal(self, x):
        return x


def test_code_in_a_state_dict_is_left_for_the_loading_object_and_said(tmp_path, caplog):
    # torch 1.13's OneCycleLR keeps a bound method (anneal_func) in its state_dict and CyclicLR a WeakMethod;
    # before, such a scheduler could not be checkpointed at all.
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=50)
    for _ in range(4):
        optimizer.step()
        scheduler.step()
    owner = Annealer()
    state = {"scheduler": scheduler.state_dict(), "explicit": {"fn": owner.anneal, "weak": weakref.WeakMethod(
        owner.anneal), "plain": len, "kept": 3}}
    with caplog.at_level("WARNING", logger="stoker"), stoker.Checkpointer(tmp_path) as ckpt:
        ckpt.save(4, state)
        ckpt.save(5, state)  # said once per entry, not per save
    said = [r.getMessage() for r in caplog.records if "holds code" in r.getMessage()]
    assert sorted(m.split("'")[1] for m in said) == ["explicit.fn", "explicit.plain", "explicit.weak"] + (
        ["scheduler.anneal_func"] if "anneal_func" in scheduler.state_dict() else [])
    restored = stoker.load_latest(tmp_path)
    assert restored.state["explicit"] == {"kept": 3}
    structure = json.loads((tmp_path / "step-5" / "manifest.json").read_text())["user"]["structure"]
    entries = dict(next(v for k, v in structure["d"] if k == "explicit")["d"])
    assert entries["fn"] == {"c": "Annealer.anneal"} and entries["plain"] == {"c": "len"}
    fresh = torch.optim.lr_scheduler.OneCycleLR(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                                max_lr=0.1, total_steps=50)
    fresh.load_state_dict(restored.state["scheduler"])
    for _ in range(3):
        fresh.optimizer.step()
        fresh.step()
        optimizer.step()
        scheduler.step()
    assert fresh.get_last_lr() == scheduler.get_last_lr()  # the schedule goes on with the fresh object's code
    with stoker.Checkpointer(tmp_path / "other") as ckpt, pytest.raises(TypeError, match=r"at 'hooks\.0'"):
        ckpt.save(1, {"hooks": [owner.anneal]})  # code in a list has no entry to leave out: refused


def test_the_reused_flat_state_mixes_nothing_between_saves_and_keeps_nothing_alive(tmp_path):
    big = {"p%d" % i: torch.full((i + 1, 2), float(i)) for i in range(50)}
    small = {"q%d" % i: torch.full((3,), -float(i), dtype=torch.float64) for i in range(5)}
    with stoker.Checkpointer(tmp_path, keep_last=0) as ckpt:
        ckpt.save(1, big)
        ckpt.save(2, small)  # fewer tensors, other names, shapes and dtypes, into the same storage
        ckpt.save(3, big)
        held = torch.ones(1000)
        alive = weakref.ref(held)
        ckpt.save(4, {"held": held})
        ckpt.wait()
        del held
        gc.collect()
        assert alive() is None  # the snapshot is taken: the Checkpointer holds no reference
    for step, state in [(1, big), (2, small), (3, big)]:
        loaded = stoker.load_checkpoint(tmp_path / ("step-%d" % step)).state
        assert loaded.keys() == state.keys()
        for k in state:
            assert torch.equal(loaded[k], state[k]) and loaded[k].dtype == state[k].dtype, (step, k)


def test_saves_from_two_threads_each_save_their_own_state(tmp_path):
    results = {}

    def saver(step, value):
        state = {"w%d" % i: torch.full((4,), float(value)) for i in range(200)}
        results[step] = ckpt.save(step, state)

    with stoker.Checkpointer(tmp_path, keep_last=0) as ckpt:
        threads = [threading.Thread(target=saver, args=(step, step * 10)) for step in range(1, 7)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(results[step] for step in range(1, 7))
    for step in range(1, 7):
        loaded = stoker.load_checkpoint(tmp_path / ("step-%d" % step)).state
        assert all(torch.equal(v, torch.full((4,), float(step * 10))) for v in loaded.values()), step
