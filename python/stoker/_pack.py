"""stoker.pack: see its docstring."""
import os

from . import _native, _params, _parquet
from .checkpoint import parse_size


def pack(source, out, shard_size=64 << 20, overwrite=False, max_side=None, quality=None, shuffle=False,
         shuffle_seed=0, file_columns=(), seekable_jpeg=False, keep_bad_images=False, threads=None):
    """Packs an ImageFolder tree, a CSV/JSONL manifest, tar shards or Parquet
    files into indexed shards (see `stoker pack --help`). Returns a summary
    dict. Parquet and Arrow (a ``.parquet`` or ``.arrow`` file, a glob
    pattern, a folder of them such as ``datasets``' ``save_to_disk``, or a
    list: Hugging Face datasets' formats; needs pyarrow) packs each row as
    a sample: image columns as images (named by their format), the
    ``ClassLabel`` column as the label with its class names, other columns as
    text, numbers or JSON; options that re-encode or reorder go through a
    temporary copy beside ``out``.
    ``shard_size`` is bytes or a string such as "64MiB". ``max_side``:
    re-encode JPEGs whose longest side (EXIF orientation applied) is over
    that many pixels to it, at ``quality`` (default 90); smaller images stay
    byte-identical and the index records what was done. ``shuffle``: write
    the samples in a random order (deterministic for ``shuffle_seed``), so
    that shards mix classes and shard-aware orders (a remote dataset read
    through a smaller cache) give batches as varied as a global shuffle's.
    ``file_columns`` (manifests): further columns holding a file's path per
    sample besides ``path``, e.g. ``["mask"]``; each becomes the field
    ``<column>.<extension>`` (``mask.png``), read with
    ``stoker.Image(keys="mask.png")``. The index records every field's kind
    (``stoker inspect`` shows them). ``seekable_jpeg``: re-write baseline
    JPEGs losslessly with restart markers (the same DCT coefficients, so the
    same pixels, checked for every image) and record where each restart interval starts, so the loader
    entropy-decodes only the part a crop covers; progressive, arithmetic,
    CMYK and undecodable JPEGs are stored as they are and counted.
    Every image field is checked as the loader first reads it (the format
    by its first bytes, then the header): one that fails (an empty file, an
    HTML page saved as ``.jpg``, a GIF, a cut header) raises
    ``stoker.CorruptionError`` (``stoker.StokerError`` for a format stoker
    does not decode) naming the sample and its file, rather than
    failing in the training loop; ``keep_bad_images=True`` stores such files
    as they are, counted (``bad_images_kept``) and the first 1,000 by key
    listed (``bad_images_named``; the index's note keeps five). ``stoker verify --decode`` finds damage past the
    header. ``threads``: how many threads read (and re-encode) the source's
    files, 1 to 1024 (the CLI's ``--threads``); by default twice the cores,
    4 to 32."""
    size = parse_size(shard_size)
    side = 0 if max_side is None else _params.integer("max_side", max_side, 1, 65500)
    if quality is not None and side == 0:
        raise ValueError("quality needs max_side (only re-encoded images take it)")
    q = 90 if quality is None else _params.integer("quality", quality, 1, 100)
    seed = _params.integer("shuffle_seed", shuffle_seed, 0, _params.U64_MAX)
    reader_threads = 0 if threads is None else _params.integer("threads", threads, 1, 1024)
    if isinstance(file_columns, str) or not all(isinstance(c, str) for c in file_columns):
        raise TypeError("file_columns must be a list of column names, such as [\"mask\"], not %r" % (file_columns,))
    if _parquet.is_parquet_source(source):
        if file_columns:
            raise ValueError("file_columns are columns of a manifest; a Parquet file's image columns are found "
                             "by themselves")
        if threads is not None:
            raise ValueError("threads are for files and manifests, not Parquet (%r): its rows are read in order "
                             "by one reader" % (source,))
        return _parquet.pack_parquet(source, out, size, _params.boolean("overwrite", overwrite), side, q,
                                     seed if _params.boolean("shuffle", shuffle) else None,
                                     _params.boolean("seekable_jpeg", seekable_jpeg),
                                     keep_bad_images=_params.boolean("keep_bad_images", keep_bad_images))
    return _native.pack(os.fspath(source), os.fspath(out), size, _params.boolean("overwrite", overwrite), side, q,
                        seed if _params.boolean("shuffle", shuffle) else None, list(file_columns),
                        _params.boolean("seekable_jpeg", seekable_jpeg),
                        _params.boolean("keep_bad_images", keep_bad_images), reader_threads)


def merge(parts, output, overwrite=False):
    """Makes one dataset of several written apart, for example by a
    ``stoker.DatasetWriter`` in each worker of a parallel job: writes
    ``output/index.stoker`` naming every shard and sample of ``parts``
    (dataset folders, in this order) from their indexes alone, without
    reading or moving the shards. Every part must lie inside ``output``
    (``output/part-00000``, ...) so that the folder moves or uploads whole.
    Refused, with the reason: a sample key in two parts, parts that name
    their classes differently, a shard in two parts, an index already in
    ``output`` (unless ``overwrite``). The merged index is streamed from the
    parts' indexes: about 16 bytes of memory a sample (10 million samples
    merge in about 2.5 s in 156 MiB). Returns a summary dict::

        # worker i of n
        with stoker.DatasetWriter("data/part-%05d" % i) as writer:
            for j in range(i, len(rows), n):
                writer.write({"__key__": "%08d" % j, ...})
        # once they are all done
        stoker.merge(["data/part-%05d" % i for i in range(n)], "data")
    """
    if isinstance(parts, (str, bytes, os.PathLike)):
        raise TypeError("parts must be a list of dataset folders, not one path (%r)" % (parts,))
    return _native.merge([os.fspath(p) for p in parts], os.fspath(output), _params.boolean("overwrite", overwrite))
