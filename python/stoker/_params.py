"""Checks of the Python API's arguments, so that a bad value is a clear
``TypeError`` or ``ValueError`` naming the parameter, never a cast error from
the native module that names none."""
import math
import numbers

U64_MAX = (1 << 64) - 1


def integer(name, value, lo=None, hi=None):
    """``value`` as an int; TypeError for bools, floats (2.7) and other
    types, ValueError outside [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("%s must be an integer, not %r" % (name, value))
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError("%s must be at least %d, not %d" % (name, lo, value))
    if hi is not None and value > hi:
        raise ValueError("%s must be at most %d, not %d" % (name, hi, value))
    return value


def env_int(name, default):
    """Environment variable ``name`` as an int (``default`` when unset or empty)."""
    import os
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError("$%s=%r is not an integer" % (name, value)) from None


def rank_and_world(rank, world_size):
    """(rank, world_size), each defaulting to torchrun's ``$RANK`` and
    ``$WORLD_SIZE`` (0 and 1 without them); ValueError for a rank out of range."""
    world = integer("world_size", world_size, 1, 1 << 20) if world_size is not None else \
        integer("$WORLD_SIZE", env_int("WORLD_SIZE", 1), 1, 1 << 20)
    rank = integer("rank", rank, 0, 1 << 20) if rank is not None else integer("$RANK", env_int("RANK", 0), 0, 1 << 20)
    return rank_in_world(rank, world)


def rank_in_world(rank, world_size):
    """(rank, world_size), both given (reshard()); ValueError for a rank out of range."""
    world = integer("world_size", world_size, 1, 1 << 20)
    rank = integer("rank", rank, 0, 1 << 20)
    if rank >= world:
        raise ValueError("rank %d is out of range for world_size %d" % (rank, world))
    return rank, world


def optional_integer(name, value, lo=None, hi=None, default=0):
    """None means `default` (the native side's "automatic")."""
    return default if value is None else integer(name, value, lo, hi)


def number(name, value, lo=None, hi=None, lo_open=False):
    """A finite real number in [lo, hi] (or (lo, hi] with lo_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("%s must be a number, not %r" % (name, value))
    value = float(value)
    if not math.isfinite(value):
        raise ValueError("%s must be a finite number, not %r" % (name, value))
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError("%s must be %s %g, not %g" % (name, "above" if lo_open else "at least", lo, value))
    if hi is not None and value > hi:
        raise ValueError("%s must be at most %g, not %g" % (name, hi, value))
    return value


def boolean(name, value):
    if not isinstance(value, (bool, numbers.Integral)) or value not in (0, 1, True, False):
        raise TypeError("%s must be True or False, not %r" % (name, value))
    return bool(value)


def choice(name, value, choices):
    if value not in choices:
        raise ValueError("%s must be one of %s, not %r" % (name, ", ".join(repr(c) for c in choices), value))
    return value


def loader_state(state):
    """A ``Loader.state_dict()`` as the native side takes it: every field an
    integer in range, or a ValueError/TypeError naming the field."""
    fields = ("seed", "epoch", "global_batch_size", "batches_consumed", "num_samples")
    if not isinstance(state, dict):
        raise TypeError("a loader state must be a dict (from Loader.state_dict()), not %r" % (type(state).__name__,))
    missing = [f for f in fields if f not in state]
    if missing:
        raise ValueError("the loader state lacks %s (is it from Loader.state_dict()?)" % ", ".join(missing))
    extra = sorted(set(state) - set(fields))
    if extra:
        raise ValueError("the loader state has unknown keys %s (is it from Loader.state_dict()?)" % ", ".join(extra))
    return {f: integer("state[%r]" % f, state[f], 0, U64_MAX) for f in fields}


def output_dtype(dtype):
    """(name, the native DType) of a loader's output dtype, given as a torch
    dtype or its name: float32, float16, bfloat16 or uint8; else a ValueError."""
    from . import _native
    name = dtype if isinstance(dtype, str) else str(dtype).replace("torch.", "")
    if name not in ("float32", "float16", "bfloat16", "uint8"):
        raise ValueError("dtype %r is not supported (float32, float16, bfloat16 or uint8)" % (dtype,))
    return name, getattr(_native.DType, name)


# DataLoader's arguments, and what stands for each in stoker's loaders.
_DATALOADER_ARGUMENTS = {
    "num_workers": "num_threads=N (or \"auto\"): stoker decodes on native threads in this process, not in worker "
                   "processes",
    "prefetch_factor": "prefetch=N batches (or \"auto\")",
    "pin_memory": "nothing: with device=\"cuda\" batches are copied from page-locked buffers on stoker's own stream",
    "pin_memory_device": "device=\"cuda:N\"",
    "persistent_workers": "nothing: the loader's threads live as long as it does",
    "worker_init_fn": "nothing: there are no worker processes to set up",
    "multiprocessing_context": "nothing: there are no worker processes",
    "collate_fn": "collate= (with fields=), which builds a batch from its samples",
    "sampler": "shuffle=, seed=, order= and rank=/world_size=: the order is stoker's own (a sampler object is not "
               "taken)",
    "batch_sampler": "batch_size= (per rank) or global_batch_size=, with shuffle=, seed= and order=",
    "generator": "seed=",
    "timeout": "nothing: a stall is reported by the loader itself",
}


def refuse_unknown(owner, unknown, instead=None):
    """TypeError for keyword arguments ``owner`` does not take, saying what
    stands for each of DataLoader's (a program ported from DataLoader passes
    them); ``instead`` overrides what stands for some of them."""
    if not unknown:
        return
    table = dict(_DATALOADER_ARGUMENTS, **(instead or {}))
    known = ["%s -> %s" % (k, table[k]) for k in unknown if k in table]
    other = [k for k in unknown if k not in table]
    parts = []
    if other:
        parts.append("%s got unexpected keyword argument%s %s" % (owner, "s" if len(other) > 1 else "",
                                                                  ", ".join(repr(k) for k in other)))
    if known:
        parts.append("%s does not take DataLoader's %s; in stoker: %s" % (
            owner, ", ".join(repr(k) for k in unknown if k in table), "; ".join(known)))
    raise TypeError(". ".join(parts))
