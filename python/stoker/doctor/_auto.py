"""The doctor attached to a program that does not know about it (`stoker
doctor -- python train.py`, `python -m stoker.doctor -- ...`): imported by
a sitecustomize the runner puts first on PYTHONPATH, it hooks, as their
modules load,

- the batches: torch DataLoader iterators' ``__next__``,
  ``stoker.Loader.__iter__`` and ``stoker.TokenLoader.__iter__`` (each
  batch asked for starts a step; the wait for it is data wait; batches
  fetched without gradients are evaluation),
- every torch optimizer's ``step`` (a step is an optimizer step: gradient
  accumulation's micro-batches are one),
- ``torch.save``, ``torch.distributed.checkpoint``'s save and load and
  ``stoker.checkpoint.Checkpointer.save`` (checkpoint),
  ``torch.cuda.synchronize`` and, on CUDA tensors, ``item``, ``cpu`` and
  ``tolist`` (sync), torch.distributed's blocking collectives and
  ``Work.wait`` (communication), and DDP's gradient all-reduce
  (communication: the backward pass waiting after its last gradient; see
  _ddp),

and at exit writes its report to $STOKER_DOCTOR_OUT/rank-<rank>.json (and
its trace to trace-<rank>.json). $STOKER_DOCTOR_PORT serves Prometheus
text on that port plus the local rank (the next free one if taken).
$STOKER_DOCTOR_WARMUP: steps not counted at the start (default 5).

Every hook calls the original whatever happens in the doctor: its own
trouble is said once on stderr and never raised into the program."""
import atexit
import functools
import importlib.abc
import importlib.util
import json
import os
import sys

from . import _ddp

_doctor = None
_unavailable = None  # why the doctor could not be made, once said


def doctor():
    """The process's doctor, made on first use (after torch loaded, so CUDA is
    seen); None when it cannot be made (said once on stderr)."""
    global _doctor, _unavailable
    if _doctor is None and _unavailable is None:
        try:
            from . import Doctor
            d = Doctor(warmup_steps=int(os.environ.get("STOKER_DOCTOR_WARMUP", "5")))
        except Exception as e:  # noqa: BLE001 - never break the program being examined
            _unavailable = "%s: %s" % (type(e).__name__, e)
            print("stoker doctor: not attached to process %d (%s): %s" % (os.getpid(), sys.executable, _unavailable),
                  file=sys.stderr)
            return None
        _doctor = d
        port = os.environ.get("STOKER_DOCTOR_PORT")
        if port:
            try:
                d.serve(int(port) + int(os.environ.get("LOCAL_RANK", "0")), host="0.0.0.0")
            except Exception as e:  # noqa: BLE001
                print("stoker doctor: not serving metrics on $STOKER_DOCTOR_PORT=%s: %s" % (port, e), file=sys.stderr)
    return _doctor


def _in_phase(category, fn, when=None):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        d = _doctor
        if d is None or (when is not None and not when(args)):
            return fn(*args, **kwargs)
        with d.phase(category):
            return fn(*args, **kwargs)
    wrapper.__stoker_doctor__ = True
    return wrapper


def _patch(owner, name, category, when=None):
    fn = getattr(owner, name, None) if owner is not None else None
    if fn is not None and not getattr(fn, "__stoker_doctor__", False):
        setattr(owner, name, _in_phase(category, fn, when))


def _on_cuda(args):
    try:
        return bool(args[0].is_cuda)
    except Exception:  # noqa: BLE001
        return False


def _patch_torch(torch):
    _patch(torch, "save", "checkpoint")
    _patch(torch.cuda, "synchronize", "sync")
    for name in ("item", "cpu", "tolist"):  # each waits for the GPU when the tensor is there
        _patch(torch.Tensor, name, "sync", when=_on_cuda)


def _wrap_method(cls, name, make):
    """Replaces cls.name by make(original), once."""
    original = getattr(cls, name, None) if cls is not None else None
    if original is None or getattr(original, "__stoker_doctor__", False):
        return
    wrapper = functools.wraps(original)(make(original))
    wrapper.__stoker_doctor__ = True
    setattr(cls, name, wrapper)


def _next_batch(fetch):
    d = doctor()
    return fetch() if d is None else d.next_batch(fetch)


def _patch_dataloader(module):
    _wrap_method(getattr(module, "_BaseDataLoaderIter", None), "__next__",
                 lambda original: lambda self: _next_batch(lambda: original(self)))


def _optimizer_stepped():
    d = _doctor
    if d is not None:
        d.optimizer_step()


def _hook_step(cls):
    def make(original):
        def step(self, *args, **kwargs):
            _optimizer_stepped()
            return original(self, *args, **kwargs)
        return step
    _wrap_method(cls, "step", make)


def _patch_optimizer(module):
    # Subclasses define their own step: each is wrapped when its first instance is made.
    def make(original):
        def init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            try:
                _hook_step(type(self))
            except Exception:  # noqa: BLE001 - a class that refuses the attribute is left unhooked
                pass
        return init
    _wrap_method(getattr(module, "Optimizer", None), "__init__", make)


_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "reduce_scatter",
                "reduce_scatter_tensor", "barrier", "all_to_all", "all_to_all_single", "gather", "scatter",
                "monitored_barrier")


def _patch_distributed(module):
    # torch.distributed re-exports distributed_c10d's functions: patch the names in both.
    for name in _COLLECTIVES:
        _patch(module, name, "communication")
    _patch(getattr(module, "Work", None), "wait", "communication")


def _patch_checkpoint(module):
    for name in ("save", "save_state_dict", "load", "load_state_dict", "async_save"):
        _patch(module, name, "checkpoint")


def _patch_stoker_checkpoint(module):
    _patch(getattr(module, "Checkpointer", None), "save", "checkpoint")


def _stoker_batches(loader, iterator):
    d = doctor()
    return iterator if d is None else d.batches(iterator, loader=loader)


def _patch_stoker(module):
    for name in ("Loader", "TokenLoader"):
        _wrap_method(getattr(module, name, None), "__iter__",
                     lambda original: lambda self: _stoker_batches(self, original(self)))


_HOOKS = {"torch": _patch_torch, "torch.utils.data.dataloader": _patch_dataloader,
          "torch.optim.optimizer": _patch_optimizer,
          "torch.distributed.distributed_c10d": _patch_distributed, "torch.distributed": _patch_distributed,
          "torch.distributed.checkpoint": _patch_checkpoint,
          "torch.nn.parallel.distributed": lambda module: _ddp.patch_ddp(module),
          "torch.autograd": lambda module: _ddp.patch_autograd(module),
          "stoker": _patch_stoker, "stoker.checkpoint": _patch_stoker_checkpoint}


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
            _apply(name, module)
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
                  "loader_seen": d._loader is not None,
                  "verdict": [{"finding": f, "fix": fix, "predicted_gain": g} for f, fix, g in d.verdict()]}
        with open(os.path.join(out, "rank-%s.json" % rank), "w") as f:
            json.dump(report, f, indent=1)
    except Exception as e:  # noqa: BLE001 - at exit too, the doctor's trouble is only said
        print("stoker doctor: cannot write the report to %s: %s" % (out, e), file=sys.stderr)


def _apply(name, module):
    try:
        _HOOKS[name](module)
    except Exception as e:  # noqa: BLE001 - an unhookable module is left as it is
        print("stoker doctor: cannot hook %s: %s" % (name, e), file=sys.stderr)


def install():
    for name in _HOOKS:
        if name in sys.modules:
            _apply(name, sys.modules[name])
    sys.meta_path.insert(0, _Finder())
    atexit.register(_write_report)
