"""How close an epoch's sample order comes to a global shuffle.

A shard-aware order (``order="shard_block"``: shards in a random order,
samples shuffled within windows of ``shard_window`` shards) is what lets a
cache smaller than the dataset download each shard once per epoch; the price
is that a batch draws from the few shards of one window. Whether that costs
anything depends on how the shards were written: shards packed from an
ImageFolder tree in class order hold one or two classes each, so a window of
one shard gives batches of one or two classes, while shards whose samples
were mixed at write time give batches as varied as a global shuffle's. These
measures let a user choose the window knowingly, on their own data:

    q = stoker.order_quality("imagenet-packed", order="shard_block", shard_window=4, batch_size=256)
    q["label_entropy_vs_global"]    # 1.0: batches as varied in labels as under a global shuffle

``measure()`` takes any order (another library's, say) over the same
samples.
"""
import numpy as np

from . import _native

__all__ = ["order_quality", "measure"]


def _entropy_bits(counts):
    """Per row of a (batches, classes) count matrix: the Shannon entropy in bits."""
    totals = counts.sum(axis=1, keepdims=True)
    p = counts / np.maximum(totals, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log2(p), 0.0)
    return terms.sum(axis=1)


def _batch_measures(order, labels, shard_of_sample, batch_size):
    batches = len(order) // batch_size
    if batches == 0:
        raise ValueError("the dataset has fewer samples (%d) than one batch (%d)" % (len(order), batch_size))
    picked = np.asarray(order[:batches * batch_size])
    out = {}
    if labels is not None:
        classes, codes = np.unique(labels, return_inverse=True)
        rows = codes[picked].reshape(batches, batch_size)
        counts = np.zeros((batches, len(classes)), dtype=np.int64)
        np.add.at(counts, (np.repeat(np.arange(batches), batch_size), rows.ravel()), 1)
        out["label_entropy_bits"] = float(_entropy_bits(counts).mean())
        out["labels_per_batch"] = float((counts > 0).sum(axis=1).mean())
    shards = np.sort(np.asarray(shard_of_sample)[picked].reshape(batches, batch_size), axis=1)
    out["shards_per_batch"] = float((1 + (np.diff(shards, axis=1) != 0).sum(axis=1)).mean())
    # How far apart, in the dataset's own order, consecutive samples are.
    out["mean_jump"] = float(np.abs(np.diff(np.asarray(order))).mean()) if len(order) > 1 else 0.0
    return out


def measure(order, labels, shard_of_sample, batch_size=64, seed=0):
    """Measures `order` (dataset sample indices, one epoch) beside a global
    shuffle of the same samples: per batch of `batch_size`, the label entropy
    in bits and the number of distinct labels (when `labels` is not None) and
    of distinct shards; the mean distance between consecutive samples'
    indices. Each ``*_vs_global`` is the ratio to the global shuffle's (1.0:
    as shuffled as it; a global shuffle's mean jump is about N/3)."""
    order = np.asarray(order)
    labels = None if labels is None else np.asarray(labels)
    shard_of_sample = np.asarray(shard_of_sample)
    ours = _batch_measures(order, labels, shard_of_sample, batch_size)
    reference = _batch_measures(np.random.default_rng(seed).permutation(len(order)), labels, shard_of_sample,
                                batch_size)
    result = dict(ours)
    for key, value in reference.items():
        result[key + "_global"] = value
        result[key + "_vs_global"] = value and ours[key] / value
    result["samples"] = len(order)
    result["batch_size"] = batch_size
    return result


def order_quality(dataset, order="shard_block", shard_window=None, batch_size=64, seed=0, epoch=0):
    """`measure()` of the order a Loader reads `dataset` in (a folder or URL;
    ``order`` "shard_block", "shuffle" or "sequential"; ``shard_window``:
    shards per window, None for 8, or what ``Loader.stats()["shard_window"]``
    says it chose) for epoch `epoch` with `seed`. Labels come from the index
    (datasets without labels get only the shard and jump measures)."""
    if order not in ("shard_block", "shuffle", "sequential"):
        raise ValueError("order must be 'shard_block', 'shuffle' or 'sequential' (for 'auto', pass the order the "
                         "Loader chose: stats()['order']), not %r" % (order,))
    layout = _native.dataset_layout(str(dataset))
    sequence = _native.epoch_order(str(dataset), getattr(_native.Order, order), shard_window or 0, seed, epoch)
    labels = layout["labels"]
    if (labels == np.iinfo(np.int64).min).all():  # no .cls fields
        labels = None
    result = measure(sequence, labels, layout["shard_of_sample"], batch_size, seed)
    result.update(order=order, shard_window=(shard_window or 8) if order == "shard_block" else None)
    return result
