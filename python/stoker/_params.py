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
