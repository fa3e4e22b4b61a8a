"""Values a training state holds that are neither tensors, containers nor
plain values, but that torch.save kept and training scripts save: NumPy
arrays and numbers (``np.random.get_state()``, a metric computed with
NumPy), ``argparse.Namespace`` (torchvision's reference scripts save
``"args": args``), paths, bytes, and torch dtypes and devices.

Each is saved in another form, tagged, and rebuilt on load by its tag from
a fixed list of types: nothing in a checkpoint names code to run, as with
pickle. Flatten calls ``to_saved`` for what it does not know;
``from_saved`` undoes it.

    {"x": "ndarray", "a": {"dtype": "<u4", "shape": [624]}, "n": {"t": "rng.1"}}

A NumPy array is saved as a uint8 tensor of its bytes (in native byte
order, C order) with its dtype and shape beside it, so any NumPy dtype of
numbers loads under any torch (torch 1.13 has no uint32); other tools that
read the safetensors file see those bytes."""
import argparse
import json
import pathlib
import sys

_PATH_TYPES = {t.__name__: t for t in (pathlib.Path, pathlib.PosixPath, pathlib.WindowsPath, pathlib.PurePath,
                                       pathlib.PurePosixPath, pathlib.PureWindowsPath)}
_NUMPY_KINDS = "biufc"  # bool, int, uint, float, complex: not objects, strings, dates or records


def _torch():
    import torch
    return torch


def to_saved(obj):
    """(tag, attributes as JSON or None, what to save instead), or None when
    ``obj`` cannot be checkpointed."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        if isinstance(obj, numpy.ndarray):
            if obj.dtype.kind not in _NUMPY_KINDS or obj.dtype.itemsize > 16:
                return None  # object arrays would need pickle; strings, dates and records are left out
            a = numpy.ascontiguousarray(obj)
            if not a.dtype.isnative:
                a = a.astype(a.dtype.newbyteorder("="))
            if not a.flags.writeable:
                a = a.copy()  # torch.from_numpy warns of read-only arrays
            raw = _torch().from_numpy(a.reshape(-1).view(numpy.uint8))
            return "ndarray", json.dumps({"dtype": a.dtype.str, "shape": list(obj.shape)}), raw
        if isinstance(obj, numpy.generic):
            if obj.dtype.kind not in "biuf" or obj.dtype.itemsize > 8:
                return None  # complex and long double have no exact JSON number
            return "npscalar", json.dumps({"dtype": obj.dtype.str}), obj.item()
    if isinstance(obj, argparse.Namespace):
        return "namespace", None, dict(vars(obj))
    if isinstance(obj, pathlib.PurePath) and type(obj).__name__ in _PATH_TYPES:
        return "path", json.dumps({"type": type(obj).__name__}), str(obj)
    if isinstance(obj, (bytes, bytearray)):
        torch = _torch()
        raw = torch.frombuffer(bytearray(obj), dtype=torch.uint8) if obj else torch.empty(0, dtype=torch.uint8)
        return "bytes", json.dumps({"type": type(obj).__name__}), raw
    torch = sys.modules.get("torch")
    if torch is not None:
        if isinstance(obj, torch.dtype):
            return "torch.dtype", None, str(obj)[len("torch."):]
        if isinstance(obj, torch.device):
            return "torch.device", None, str(obj)
    return None


def from_saved(tag, attrs, value):
    """The value ``to_saved`` made (tag, attributes, the saved form loaded) back."""
    attrs = attrs or {}
    if tag == "ndarray":
        import numpy
        raw = value.numpy() if hasattr(value, "numpy") else numpy.asarray(value)
        return raw.view(numpy.dtype(attrs["dtype"])).reshape(attrs["shape"])
    if tag == "npscalar":
        import numpy
        return numpy.dtype(attrs["dtype"]).type(value)
    if tag == "namespace":
        return argparse.Namespace(**value)
    if tag == "path":
        return _PATH_TYPES.get(attrs.get("type"), pathlib.PurePath)(value)
    if tag == "bytes":
        data = bytes(value.numpy()) if hasattr(value, "numpy") else bytes(value)
        return bytearray(data) if attrs.get("type") == "bytearray" else data
    if tag == "torch.dtype":
        dtype = getattr(_torch(), value, None)
        if not isinstance(dtype, _torch().dtype):
            raise _corrupt("names torch dtype %r, which this torch (%s) lacks" % (value, _torch().__version__))
        return dtype
    if tag == "torch.device":
        return _torch().device(value)
    raise _corrupt("holds a value tagged %r, which this stoker does not know (written by a newer one?)" % (tag,))


def _corrupt(what):
    from . import CorruptionError
    return CorruptionError("the checkpoint's state structure " + what)
