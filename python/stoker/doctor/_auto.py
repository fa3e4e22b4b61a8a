"""The doctor attached to a program that does not know about it (`stoker
doctor -- python train.py`, `python -m stoker.doctor -- ...`): imported by
a sitecustomize the runner puts first on PYTHONPATH, it hooks, as their
modules load,

- the batches: torch DataLoader iterators' ``__next__`` and
  ``stoker.Loader.__iter__`` (each batch asked for starts a step; the wait
  for it is data wait),
- ``torch.save`` (checkpoint), ``Tensor.item``, ``torch.cuda.synchronize``
  (sync), and torch.distributed's blocking collectives (communication),

and at exit writes its report to $STOKER_DOCTOR_OUT/rank-<rank>.json (and
its trace to trace-<rank>.json). $STOKER_DOCTOR_PORT serves Prometheus
text on that port plus the local rank."""
import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import sys

_doctor = None


def doctor():
    """The process's doctor, made on first use (after torch loaded, so CUDA is seen)."""
    global _doctor
    if _doctor is None:
        from . import Doctor
        _doctor = Doctor()
        port = os.environ.get("STOKER_DOCTOR_PORT")
        if port:
            _doctor.serve(int(port) + int(os.environ.get("LOCAL_RANK", "0")), host="0.0.0.0")
    return _doctor


def _in_phase(category, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        d = _doctor
        if d is None or d._current is None or d._phase is not None:
            return fn(*args, **kwargs)
        with d.phase(category):
            return fn(*args, **kwargs)
    wrapper.__stoker_doctor__ = True
    return wrapper


def _patch(owner, name, category):
    fn = getattr(owner, name, None)
    if fn is not None and not getattr(fn, "__stoker_doctor__", False):
        setattr(owner, name, _in_phase(category, fn))


def _patch_torch(torch):
    _patch(torch, "save", "checkpoint")
    _patch(torch.Tensor, "item", "sync")
    _patch(torch.cuda, "synchronize", "sync")


def _wrap_method(cls, name, make):
    """Replaces cls.name by make(original), once."""
    original = getattr(cls, name, None) if cls is not None else None
    if original is None or getattr(original, "__stoker_doctor__", False):
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper.__stoker_doctor__ = True
    setattr(cls, name, wrapper)


def _patch_dataloader(module):
    _wrap_method(getattr(module, "_BaseDataLoaderIter", None), "__next__",
                 lambda original: lambda self: doctor().next_batch(lambda: original(self)))


def _patch_distributed(module):
    for name in ("all_reduce", "all_gather", "broadcast", "reduce_scatter", "barrier", "all_to_all"):
        _patch(module, name, "communication")


def _patch_stoker(module):
    _wrap_method(getattr(module, "Loader", None), "__iter__",
                 lambda original: lambda self: doctor().batches(original(self)))


_HOOKS = {"torch": _patch_torch, "torch.utils.data.dataloader": _patch_dataloader,
          "torch.distributed.distributed_c10d": _patch_distributed, "stoker": _patch_stoker}


class _Finder(importlib.abc.MetaPathFinder):
    """Patches a hooked module right after it is executed."""

    def find_spec(self, name, path, target=None):
        if name not in _HOOKS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _HOOKS[name](module)
        spec.loader = _Loader(loader, exec_and_patch)
        return spec


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, exec_module):
        self._inner, self._exec = inner, exec_module

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._exec(module)


def _write_report():
    d = _doctor
    out = os.environ.get("STOKER_DOCTOR_OUT")
    if d is None or not out:
        return
    d.close()
    rank = os.environ.get("RANK", str(os.getpid()))
    try:
        with open(os.path.join(out, "trace-%s.json" % rank), "w") as f:
            f.write(d.chrome_trace())
        report = {"rank": rank, "pid": os.getpid(), "argv": sys.argv, "account": d.account(), "report": d.report(),
                  "verdict": [{"finding": f, "fix": fix, "predicted_gain": g} for f, fix, g in d.verdict()]}
        with open(os.path.join(out, "rank-%s.json" % rank), "w") as f:
            json.dump(report, f, indent=1)
    except OSError as e:
        print("stoker doctor: cannot write the report to %s: %s" % (out, e), file=sys.stderr)


def install():
    for name, hook in _HOOKS.items():
        if name in sys.modules:
            hook(sys.modules[name])
    sys.meta_path.insert(0, _Finder())
    atexit.register(_write_report)
