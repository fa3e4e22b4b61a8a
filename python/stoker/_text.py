"""Small helpers for the words of stoker's messages (as stoker/text.h's
Counted for the C++ side)."""


def counted(n, one, many):
    """"1 shard", "2 shards": `n` and the noun in the number it takes."""
    return "%d %s" % (n, one if n == 1 else many)
