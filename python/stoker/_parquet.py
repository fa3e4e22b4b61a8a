"""Packing Parquet files (Hugging Face datasets' format) and Arrow files
(their save_to_disk and cache) into a stoker dataset: each row a sample,
each column a field. Used by stoker.pack and
`stoker pack X.parquet OUT` (which runs main() below).

Columns map as Hugging Face's features say, or by their Arrow types:
- an image column (the `Image` feature: {"bytes", "path"}, or raw bytes that
  are an image stoker decodes: JPEG, PNG, WebP, TIFF, PGM/PPM, BMP): the
  first becomes the field named by each image's format ("jpg", "png",
  "webp", "tif", "pgm", "ppm", "bmp"), later ones "<column>.<format>";
  other files in such a struct (audio) keep their path's extension, else
  ".bin". In a column that holds images (the `Image` feature, or a column
  named like one: "jpg", "png", ...) bytes that are no such image are a bad
  image, named (the file, row and sample) or, with keep_bad_images, kept
  under the path's image extension, else the column's last image's, else
  "jpg", counted and named;
- the label: the `ClassLabel` column named "label" (else the first
  `ClassLabel`, else an integer column named "label", "labels" or "cls")
  becomes "cls", and its names the dataset's class names;
- "__key__" (webdataset-derived datasets) gives the sample's key; otherwise
  its position over all files, zero-padded;
- strings are text, numbers numbers, lists and structs JSON (what
  stoker.DatasetWriter stores for such values); nulls leave the field out.
"""
import argparse
import glob
import json
import os
import shutil
import sys
import time

from . import _native
from ._text import counted

_LABEL_NAMES = ("label", "labels", "cls")
# The fields the main image may take, one per format stoker decodes (_native.image_field_extension).
_IMAGE_FIELDS = ("jpg", "png", "webp", "tif", "pgm", "ppm", "bmp")


def _is_image_name(name):
    return _native.conventional_field_kind(name) == _native.FieldKind.image


def parquet_files(source):
    """The Parquet or Arrow files `source` names: a file, a glob pattern, a
    folder (its *.parquet or *.arrow files: a Hugging Face save_to_disk
    folder holds the latter), or a list of those; in name order per entry."""
    entries = [source] if isinstance(source, (str, os.PathLike)) else list(source)
    files = []
    for entry in entries:
        entry = os.fspath(entry)
        if os.path.isdir(entry):
            found = sorted(glob.glob(os.path.join(entry, "*.parquet"))) or sorted(
                glob.glob(os.path.join(entry, "*.arrow")))
            if not found:
                splits = sorted(n for n in os.listdir(entry) if glob.glob(os.path.join(entry, n, "*.arrow")))
                raise ValueError("%s: a folder holding no .parquet or .arrow files%s" % (
                    entry, "; it holds the splits %s: pack one, e.g. %s" % (
                        ", ".join(splits), os.path.join(entry, splits[0])) if splits else ""))
        elif any(c in entry for c in "*?["):
            found = sorted(glob.glob(entry))
            if not found:
                raise FileNotFoundError("%s: no file matches" % entry)
        elif not os.path.exists(entry):
            raise FileNotFoundError("%s: no such file" % entry)
        else:
            found = [entry]
        files += found
    return files


def is_parquet_source(source):
    """Whether stoker.pack should read `source` as Parquet."""
    if isinstance(source, (list, tuple)):
        return bool(source) and all(is_parquet_source(s) for s in source)
    source = os.fspath(source)
    if source.endswith((".parquet", ".arrow")):
        return True
    if os.path.isdir(source):
        names = os.listdir(source)
        if "dataset_dict.json" in names:
            return True  # a Hugging Face DatasetDict's save_to_disk: its splits are folders
        return any(n.endswith((".parquet", ".arrow")) for n in names) and not any(
            n.endswith(".tar") or os.path.isdir(os.path.join(source, n)) for n in names)
    return False


def _features(path, schema):
    """Hugging Face's features of a file's columns: from its schema's
    metadata, else the dataset_info.json that save_to_disk writes beside its
    .arrow files; {} when neither says."""
    meta = schema.metadata or {}
    try:
        if b"huggingface" in meta:
            features = json.loads(meta[b"huggingface"]).get("info", {}).get("features")
            if isinstance(features, dict):
                return features
        info = os.path.join(os.path.dirname(os.path.abspath(path)), "dataset_info.json")
        if os.path.exists(info):
            with open(info) as f:
                features = json.load(f).get("features")
            if isinstance(features, dict):
                return features
    except (ValueError, AttributeError, OSError):
        pass
    return {}


class _Layout:
    """How one file's columns become fields (the same for every file of a
    dataset: checked)."""

    def __init__(self, path, schema):
        import pyarrow
        self.columns = list(schema.names)
        features = _features(path, schema)
        self.class_names = None
        self.label = None
        class_labels = [c for c in self.columns if isinstance(features.get(c), dict)
                        and features[c].get("_type") == "ClassLabel"]
        if "label" in class_labels:
            self.label = "label"
        elif class_labels:
            self.label = class_labels[0]
        else:
            for name in _LABEL_NAMES:
                if name in self.columns and pyarrow.types.is_integer(schema.field(name).type):
                    self.label = name
                    break
        if self.label is not None and self.label in class_labels:
            names = features[self.label].get("names")
            self.class_names = list(names) if isinstance(names, list) else None
        self.images = []  # file columns, in order
        for c in self.columns:
            kind = schema.field(c).type
            if (isinstance(features.get(c), dict) and features[c].get("_type") in ("Image", "Audio")) or (
                    pyarrow.types.is_struct(kind) and {kind[i].name for i in range(kind.num_fields)} == {"bytes",
                                                                                                         "path"}) or (
                    pyarrow.types.is_binary(kind) or pyarrow.types.is_large_binary(kind)):
                self.images.append(c)
        # The main image, whose field is named by its format alone ("jpg"): the first Image feature, else
        # the first file column (an Audio column before it must not take the name).
        declared = [c for c in self.images if isinstance(features.get(c), dict) and features[c].get("_type") == "Image"]
        self.main_image = declared[0] if declared else (self.images[0] if self.images else None)
        # Columns whose every value must be an image: bytes that are not one are a bad image, never a ".bin".
        self.image_only = set(declared) | {c for c in self.images if c not in features and _is_image_name(c.lower())}
        self.last_format = {}  # an image column's last good image's format: where its bad ones are kept
        self.names = {}
        for c in self.columns:
            if c == "__key__" or (c.startswith("__") and c.endswith("__")) or c == self.label:
                continue
            if c in self.images:
                continue
            name = c.lower().replace("/", "_")
            self.names[c] = name
        # What the label and the main image take: a column of the same name would overwrite them.
        taken = {"cls": self.label} if self.label is not None else {}
        if self.main_image is not None:
            taken.update((ext, self.main_image) for ext in _IMAGE_FIELDS)
        for c, name in self.names.items():
            if name in taken:
                raise ValueError("%s: columns %r and %r would both be the field %r; rename one" % (
                    path, taken[name], c, name))
            taken[name] = c

    def same_as(self, other):
        return (self.columns, self.label, self.images, self.names) == (other.columns, other.label, other.images,
                                                                      other.names)

    def file_field(self, column, value):
        """(field name, bytes) of a file column's value, or None."""
        if isinstance(value, dict):
            data, path = value.get("bytes"), value.get("path")
            if data is None and path:
                with open(path, "rb") as f:
                    data = f.read()
        else:
            data, path = value, None
        if data is None:
            return None
        ext = _native.image_field_extension(data)
        is_image = ext is not None
        if is_image:
            self.last_format[column] = ext
        else:
            ext = os.path.splitext(path)[1][1:].lower() if path else ""
            if column in self.image_only:
                # A bad image (an error page, a cut file): stored, if kept, where the loader looks for the
                # column's images (its path's format, else its last image's), so that the loader meets it as
                # a bad sample rather than as a sample without the image.
                ext = ext if _is_image_name(ext) else self.last_format.get(column, "jpg")
                is_image = True
            else:
                ext = ext or "bin"
        if column == self.main_image and is_image:
            return ext, data
        return "%s.%s" % (column.lower().replace("/", "_"), ext), data


def _open_table(path):
    """(schema, an iterator of record batches of at most 64 rows) of a
    Parquet file (a row group at a time, through a small buffer: memory
    follows the row group's size, not the file's) or an Arrow file
    (Hugging Face's save_to_disk and cache: the IPC stream format, mapped)."""
    import pyarrow
    import pyarrow.parquet
    if path.endswith(".arrow"):
        source = pyarrow.memory_map(path)
        try:
            reader = pyarrow.ipc.open_stream(source)
        except pyarrow.ArrowInvalid:
            reader = pyarrow.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            batches = iter(reader)
        return reader.schema, (batch.slice(start, 64) for batch in batches for start in range(0, batch.num_rows, 64))
    pf = pyarrow.parquet.ParquetFile(path, pre_buffer=False, buffer_size=4 << 20)
    return pf.schema_arrow, pf.iter_batches(batch_size=64)


def _rows(files, layout_of):
    """(path, row, layout, values) of every row of `files`, in order. The
    record batches are read (Parquet pages decoded, pyarrow releasing the
    GIL) on a thread of their own, at most 4 batches ahead, while the caller
    writes rows: packing overlaps reading and writing."""
    import queue
    import threading
    import pyarrow
    import pyarrow.ipc  # noqa: F401
    ahead = queue.Queue(maxsize=4)
    stop = threading.Event()

    def put(item):
        while not stop.is_set():
            try:
                ahead.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def read():
        try:
            for path in files:
                kind = "Arrow" if path.endswith(".arrow") else "Parquet"
                try:
                    schema, batches = _open_table(path)
                except (pyarrow.ArrowException, OSError) as e:
                    raise ValueError("%s: cannot be read as %s (%s)" % (path, kind, e)) from None
                layout = layout_of(path, schema)
                row = 0
                try:
                    for batch in batches:
                        if not put((path, row, layout, batch)):
                            return
                        row += batch.num_rows
                except pyarrow.ArrowException as e:
                    raise ValueError("%s: the rows after row %d cannot be read (%s)" % (path, row, e)) from None
            put(None)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread, in order
            put(e)

    reader = threading.Thread(target=read, name="stoker-parquet-reader", daemon=True)
    reader.start()
    try:
        while True:
            item = ahead.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            path, row, layout, batch = item
            for values in batch.to_pylist():
                yield path, row, layout, values
                row += 1
    finally:
        stop.set()
        reader.join()


def total_rows(files):
    import pyarrow.parquet
    total = 0
    for path in files:
        if path.endswith(".arrow"):
            return None  # a stream says its length only once read
        try:
            total += pyarrow.parquet.ParquetFile(path).metadata.num_rows
        except Exception:  # noqa: BLE001 - reported with its file when rows are read
            return None
    return total


def require_pyarrow():
    try:
        import pyarrow.parquet  # noqa: F401
    except ImportError as e:
        raise ImportError("reading Parquet needs pyarrow, which %s cannot import (%s): pip install pyarrow, or set "
                          "STOKER_PYTHON to a Python that has it" % (sys.executable, e)) from None


def write_parquet(files, out, shard_bytes, overwrite, on_progress=None, keep_bad_images=False):
    """Writes every row of `files` into a new dataset at `out`; returns the
    DatasetWriter's summary."""
    require_pyarrow()
    from ._writer import DatasetWriter
    first = {}

    def layout_of(path, schema):
        layout = _Layout(path, schema)
        if "layout" not in first:
            first["layout"], first["path"] = layout, path
        elif not layout.same_as(first["layout"]):
            raise ValueError("%s: its columns (%s) differ from %s's (%s); pack them separately"
                             % (path, ", ".join(layout.columns), first["path"], ", ".join(first["layout"].columns)))
        return layout

    # The class names come from the first file's schema, before any row.
    rows = _rows(files, layout_of)
    writer = None
    n = 0
    try:
        for path, row, layout, values in rows:
            if writer is None:
                writer = DatasetWriter(out, shard_size=shard_bytes, overwrite=overwrite,
                                       class_names=layout.class_names, keep_bad_images=keep_bad_images)
            sample = {"__key__": values.get("__key__") if values.get("__key__") is not None else "%09d" % n}
            try:
                if layout.label is not None and values.get(layout.label) is not None:
                    sample["cls"] = values[layout.label]
                for column in layout.images:
                    if values.get(column) is not None:
                        field = layout.file_field(column, values[column])
                        if field is not None:
                            sample[field[0]] = field[1]
                for column, name in layout.names.items():
                    sample[name] = values.get(column)
                writer.write(sample)
            except (ValueError, TypeError, OSError) as e:
                raise type(e)("%s: row %d (counting from 0): %s" % (path, row, e)) from None
            n += 1
            if on_progress is not None:
                on_progress(n)
        if writer is None:
            raise ValueError("%s: no rows to pack" % ", ".join(files))
        return writer.close()
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        rows.close()  # stops the reading thread now, not when the traceback is dropped


def pack_parquet(source, out, shard_bytes, overwrite, max_side, quality, shuffle_seed, seekable_jpeg,
                 on_progress=None, keep_bad_images=False):
    """stoker.pack for Parquet: rows written straight into `out`, or, with
    options that re-encode or reorder (max_side, seekable_jpeg, shuffle),
    into a temporary dataset beside it that pack then rewrites into `out`."""
    files = parquet_files(source)
    out = os.fspath(out)
    if not (max_side or seekable_jpeg or shuffle_seed is not None):
        return write_parquet(files, out, shard_bytes, overwrite, on_progress, keep_bad_images)
    if not overwrite and os.path.exists(os.path.join(out, "index.stoker")):
        raise FileExistsError("'%s' already holds a dataset (index.stoker exists); pass overwrite=True (--force) "
                              "to replace it" % out)
    staging = os.path.join(os.path.dirname(os.path.abspath(out)) or ".",
                           ".%s.parquet-staging-%d" % (os.path.basename(os.path.abspath(out)), os.getpid()))
    try:
        write_parquet(files, staging, shard_bytes, True, on_progress, keep_bad_images)
        return _native.pack(staging, out, shard_bytes, overwrite, max_side, quality, shuffle_seed, [],
                            seekable_jpeg, keep_bad_images, 0)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def main(argv):
    """`stoker pack X.parquet OUT`: the command line's pack for Parquet."""
    from .checkpoint import parse_size
    ap = argparse.ArgumentParser(prog="stoker pack", description="Pack Parquet files (Hugging Face datasets) into "
                                 "indexed shards: each row a sample, each column a field.")
    ap.add_argument("source", nargs="+", help=".parquet or .arrow files, glob patterns or folders of them")
    ap.add_argument("out", help="output folder for shard-NNNNNN.tar and index.stoker")
    ap.add_argument("--shard-size", default="64MiB")
    ap.add_argument("--force", action="store_true", help="replace a dataset already in OUT")
    ap.add_argument("--max-side", type=int, default=0)
    ap.add_argument("--quality", type=int, default=90)
    ap.add_argument("--shuffle", action="store_true")
    ap.add_argument("--shuffle-seed", type=int, default=0)
    ap.add_argument("--seekable-jpeg", action="store_true")
    ap.add_argument("--keep-bad-images", action="store_true",
                    help="store images that fail the header check as they are, counted and named")
    args = ap.parse_args(argv)
    try:
        files = parquet_files(args.source)
        require_pyarrow()
        total = total_rows(files)
        last = [0.0]

        def progress(n):
            now = time.monotonic()
            if sys.stderr.isatty() and (now - last[0] > 0.5 or n == total):
                last[0] = now
                sys.stderr.write("\rpack: %d%s samples" % (n, "/%d" % total if total else ""))
                sys.stderr.flush()
        summary = pack_parquet(files, args.out, parse_size(args.shard_size), args.force, args.max_side,
                               args.quality, args.shuffle_seed if args.shuffle else None, args.seekable_jpeg,
                               progress, args.keep_bad_images)
    except KeyboardInterrupt:
        sys.stderr.write("\nstoker pack: interrupted; nothing was kept\n")
        return 130
    except (ValueError, TypeError, OSError, ImportError, RuntimeError) as e:
        if sys.stderr.isatty():
            sys.stderr.write("\n")
        sys.stderr.write("stoker pack: %s\n" % e)
        return 1
    if sys.stderr.isatty():
        sys.stderr.write("\n")
    kind = "Arrow" if all(f.endswith(".arrow") for f in files) else "Parquet"
    if summary.get("bad_images_kept"):
        sys.stderr.write("stoker pack: warning: kept %s that the loader cannot decode, as %s (--keep-bad-images)%s\n"
                         % (counted(summary["bad_images_kept"], "image", "images"),
                            "it was" if summary["bad_images_kept"] == 1 else "they were",
                            "".join("\n  " + n for n in summary["bad_images_named"])))
    print("packed %s from %s into %s (%s) in %s" % (
        counted(summary["samples"], "sample", "samples"), counted(len(files), kind + " file", kind + " files"),
        counted(summary["shards"], "shard", "shards"), _size(summary["shard_bytes"]), args.out))
    if summary["class_names"]:
        print("labels: %s, names from the ClassLabel feature" % counted(len(summary["class_names"]), "class",
                                                                         "classes"))
    print("index: %s" % summary["index_path"])
    return 0


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return ("%d %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0
