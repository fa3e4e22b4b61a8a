"""What the store says of a generation a worker is in: whether the group
went on without it, or a member left it for the next one (the watch's
reasons to stop waiting in a collective; store keys in _rendezvous.py)."""
from ._group import _peek


def went_on(store, generation):
    """Whether the group went on to a later generation without this worker
    (it was cut off for a while, and the others left it behind)."""
    latest = int(store.add("gen", 0))
    if latest > generation:
        return "the group went on to generation %d without this worker" % latest
    return None


def member_left(store, members, generation):
    """Whether a member of ``generation`` registered for the next one: it
    left this generation (it found itself cut off, or would not commit), and
    the collective waiting for it will not complete. A newcomer registering
    there (a join) is not a member and does not count."""
    count = int(store.add("g%d/n" % (generation + 1), 0))
    for i in range(count):
        who = _peek(store, "g%d/m%d" % (generation + 1, i))
        if who in members:
            return "%s left generation %d for the next one" % (who, generation)
    return None
