"""Per-band statistics of an Array field, for its Normalize:

    stats = stoker.band_stats("eurosat-packed", key="tif")
    T.Normalize(stats["mean"], stats["std"])

Read through the loader (native decoding, every sample once, in the
dataset's order), summed in float64.
"""
import math

from . import _params


def band_stats(dataset, key="tif", layout="HWC", max_samples=None, num_threads=None, batch_size=64):
    """Mean, standard deviation (population), minimum and maximum of each
    band of the Array field ``key`` over the dataset (or its first
    ``max_samples`` samples), as lists of floats, with ``samples`` and
    ``values`` (elements a band) counted. ``layout`` says where the bands
    are: "HWC" (the last axis of [H, W, bands]; a 2-D array is one band) or
    "CHW" (the first). Samples lacking the key are refused (ValueError), as
    a required field is. Arrays may differ in height and width, not in
    their number of bands."""
    import torch

    from . import Array, Loader
    if layout not in ("HWC", "CHW"):
        raise ValueError("layout is \"HWC\" or \"CHW\", not %r" % (layout,))
    limit = None if max_samples is None else _params.integer("max_samples", max_samples, 1, _params.U64_MAX)
    loader = Loader(dataset, batch_size=batch_size, shuffle=False, num_threads=num_threads, log_epochs=False,
                    fields={"x": Array(key)})
    total = squares = low = high = shift = None
    samples = values = 0

    def add(array):
        nonlocal total, squares, low, high, shift, values
        a = array.double()
        if a.dim() == 2:
            a = a.unsqueeze(-1)
        elif a.dim() != 3:
            raise ValueError("band_stats: an array of shape %s: 2-D or 3-D arrays only" % (tuple(array.shape),))
        bands = a.reshape(-1, a.shape[-1]) if layout == "HWC" else a.reshape(a.shape[0], -1).t()
        if total is not None and bands.shape[1] != total.shape[0]:
            raise ValueError("band_stats: an array of %d bands after arrays of %d" % (bands.shape[1], total.shape[0]))
        if shift is None:
            shift = bands.mean(0)  # sums of x - shift: no cancellation for data far from 0
        d = bands - shift
        s, q = d.sum(0), (d * d).sum(0)
        lo, hi = bands.min(0).values, bands.max(0).values
        if total is None:
            total, squares, low, high = s, q, lo, hi
        else:
            total, squares = total + s, squares + q
            low, high = torch.minimum(low, lo), torch.maximum(high, hi)
        values += bands.shape[0]

    for batch in loader:
        x = batch["x"]
        arrays = list(x) if isinstance(x, torch.Tensor) else x
        for array in arrays:
            if limit is not None and samples >= limit:
                break
            add(array)
            samples += 1
        if limit is not None and samples >= limit:
            break
    if samples == 0:
        raise ValueError("band_stats: %s has no samples" % (dataset,))
    offset = total / values
    std = [math.sqrt(max(v, 0.0)) for v in (squares / values - offset * offset).tolist()]
    return {"mean": (shift + offset).tolist(), "std": std, "min": low.tolist(), "max": high.tolist(), "samples": samples,
            "values": values}
