"""The two shapes of a stoker.Loader batch, seen the same way by the elastic
runner and Trainer: ``(images, labels[, indices])`` tuples, or dicts (typed
fields, ``fields=``) whose sample ids are under ``"__index__"``."""

INDEX_KEY = "__index__"


def batch_parts(item):
    """(what the step trains on, samples in it, sample ids or None): a
    tuple's (images, labels), or the dict itself (ids included, so that a
    dict slice stays whole)."""
    if isinstance(item, dict):
        indices = item.get(INDEX_KEY)
        return item, _dict_length(item), indices
    return (item[0], item[1]), len(item[1]), item[2] if len(item) > 2 else None


def slice_batch(batch, a, b):
    """Samples [a, b) of a batch as batch_parts returns it: a tuple of
    slices, or a dict whose every value (tensor or list) is sliced; a
    stoker.TokenLoader batch's ``cu_seqlens`` (boundaries over the flattened
    rows, not a value per row) keeps the boundaries of rows [a, b)."""
    if isinstance(batch, dict):
        return {k: _rows_of(batch, k, v, a, b) for k, v in batch.items()}
    return tuple(t[a:b] for t in batch)


def _rows_of(batch, key, value, a, b):
    if key == "cu_seqlens" and "input_ids" in batch:
        # Every row's end is a boundary (its pieces, then its padding): rows [a, b) hold those in [a*L, b*L].
        seq_len = batch["input_ids"].shape[1]
        lo, hi = a * seq_len, b * seq_len
        return value[(value >= lo) & (value <= hi)] - lo
    return value[a:b]


def _dict_length(batch):
    if INDEX_KEY in batch:
        return len(batch[INDEX_KEY])
    for value in batch.values():
        return len(value)
    return 0
