"""Makes torch's elastic launcher (torchrun) work on Debian's torch 1.13 with
Python 3.11, and exposes the rendezvous keep-alive as settings.

- ``Std.from_str("0")`` returns None on Python 3.11 (iterating an IntFlag no
  longer yields its zero and alias members), so torchrun fails at start-up
  with "'NoneType' object has no attribute 'get'". The fix maps the number
  straight to the flag.
- The c10d rendezvous declares a node dead after 3 missed keep-alives 5 s
  apart, hard-coded: 15 s of every recovery from a lost node.
  ``$STOKER_RDZV_KEEP_ALIVE_S`` and ``$STOKER_RDZV_KEEP_ALIVE_ATTEMPTS``
  (defaults 1 and 3) set them.
- torch 2.4 and later share the c10d rendezvous's store with the workers.
  2.4 and 2.5 put each round's keys under each agent's own restart count,
  and only the agent whose worker failed counts a restart, so after a
  failure the workers of one round use different prefixes (they never
  meet) or read an earlier round's addresses: pytorch/pytorch#135712. 2.6
  dropped the prefix, but the store server is still the first round's: the
  workers of a restarted round find the last round's gloo addresses there
  and connect to dead ports ("connectFullMesh failed ... Connection
  refused", then a 300 s connect timeout; seen on 2.9.1). The launcher
  sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` on every version that
  shares (rank 0's worker hosts each round's store, as before 2.4) unless
  it is set already.
"""
import datetime
import os
import re


def _patch_std():
    from torch.distributed.elastic.multiprocessing import api
    Std = api.Std
    try:
        if Std.from_str("0") is Std.NONE and Std.from_str("3") is Std.ALL:
            return False
    except Exception:
        pass
    value_re, mapping_re = r"^[0123]$", r"^(\d:[0123],)*(\d:[0123])$"

    def from_str(cls, vm):
        if re.match(value_re, vm):
            return cls(int(vm))
        if re.match(mapping_re, vm):
            return {int(i): cls(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
        raise ValueError("%s does not match: <%s> or <%s>" % (vm, value_re, mapping_re))

    Std.from_str = classmethod(from_str)
    return True


def _patch_keep_alive():
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    except ImportError:
        return False
    original = getattr(dr, "RendezvousSettings", None)
    if original is None or getattr(original, "_stoker_patched", False):
        return False
    interval = float(os.environ.get("STOKER_RDZV_KEEP_ALIVE_S", "1"))
    attempts = int(os.environ.get("STOKER_RDZV_KEEP_ALIVE_ATTEMPTS", "3"))

    def settings(*args, **kwargs):
        if "keep_alive_interval" in kwargs:
            kwargs["keep_alive_interval"] = datetime.timedelta(seconds=interval)
        if "keep_alive_max_attempt" in kwargs:
            kwargs["keep_alive_max_attempt"] = attempts
        return original(*args, **kwargs)

    settings._stoker_patched = True
    dr.RendezvousSettings = settings
    return True


def shares_rendezvous_store(version):
    """Whether this torch version's c10d rendezvous shares its store with the
    workers across rounds (2.4 and later; see the module's help)."""
    major_minor = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    return major_minor >= (2, 4)


def _unshare_store():
    import torch
    if "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in os.environ or not shares_rendezvous_store(torch.__version__):
        return False
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    return True


def apply():
    """Returns the list of fixes applied to this torch."""
    fixes = []
    if _patch_std():
        fixes.append("Std.from_str")
    if _patch_keep_alive():
        fixes.append("rendezvous keep-alive")
    if _unshare_store():
        fixes.append("a store per round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)")
    return fixes
