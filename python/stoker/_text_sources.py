"""Where stoker.tokenize reads documents: JSON Lines, text files, Parquet
(PyPI's pyarrow) and packed stoker datasets, in the order given; JSON Lines
and text files may be compressed (.gz, .bz2, .xz, and .zst with the
zstandard module), as corpora are usually shipped (The Pile's .jsonl.zst,
Hugging Face's Parquet shards). Every problem is a ValueError naming the
file and the line or row: nothing is skipped."""
import bz2
import gzip
import io
import json
import lzma
import os

_COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
_KINDS = ".jsonl, .json, .txt (each may be .gz, .bz2, .xz or .zst), .parquet or a packed stoker dataset"


def _open(path):
    """A binary reader of ``path``, decompressed by its suffix."""
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    if path.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.endswith(".zst"):
        try:
            import zstandard
        except ImportError:
            raise ImportError("%s: reading .zst needs the zstandard module (Debian: python3-zstandard; PyPI: "
                              "zstandard)" % path) from None
        return io.BufferedReader(_ZstdFrames(path, zstandard))
    return open(path, "rb")


class _ZstdFrames(io.RawIOBase):
    """A .zst file's content, frame after frame (zstd -T and pzstd write
    several). zstandard's own stream reader ends quietly inside a truncated
    frame, losing its lines; this raises EOFError there instead."""

    def __init__(self, path, zstandard):
        super().__init__()
        self._file = open(path, "rb")
        self._zstd = zstandard.ZstdDecompressor()
        self._frame = None  # the decompressor of the frame being read, None between frames
        self._out, self._at = b"", 0  # decompressed bytes, and how many of them were read

    def readable(self):
        return True

    def readinto(self, buffer):
        while self._at == len(self._out):
            chunk = self._file.read(1 << 20)
            if not chunk:
                if self._frame is not None:
                    raise EOFError("the .zst file ends inside a frame (truncated)")
                return 0
            parts = []
            while chunk:
                if self._frame is None:
                    self._frame = self._zstd.decompressobj()
                parts.append(self._frame.decompress(chunk))
                chunk = b""
                if self._frame.eof:
                    chunk, self._frame = self._frame.unused_data, None
            self._out, self._at = b"".join(parts), 0
        n = min(len(buffer), len(self._out) - self._at)
        buffer[:n] = memoryview(self._out)[self._at:self._at + n]
        self._at += n
        return n

    def close(self):
        self._file.close()
        super().close()


def _unpacking_errors():
    errors = [EOFError, OSError, lzma.LZMAError]
    try:
        import zstandard
        errors.append(zstandard.ZstdError)
    except ImportError:
        pass
    return tuple(errors)


def _lines(path):
    """(number, line) of ``path``; a file that does not decompress is a ValueError naming where it stopped."""
    number = 0
    with _open(path) as f:  # a file that cannot be opened says so itself (FileNotFoundError, ...)
        try:
            for number, line in enumerate(f, 1):
                yield number, line
        except _unpacking_errors() as e:
            raise ValueError("%s: cannot be read past line %d (%s: %s)" % (path, number, type(e).__name__, e)) \
                from None


def _jsonl(path, text_field):
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise ValueError("%s:%d: not valid JSON (%s)" % (path, number, e)) from None
        if not isinstance(obj, dict) or text_field not in obj:
            raise ValueError("%s:%d: no %r field (give text_field=)" % (path, number, text_field))
        text = obj[text_field]
        if not isinstance(text, str):
            raise ValueError("%s:%d: %r is %s, not text" % (path, number, text_field, type(text).__name__))
        yield text


def _text_file(path, lines):
    data = b"".join(line for _, line in _lines(path))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("%s: not UTF-8 at byte %d" % (path, e.start)) from None
    if not lines:
        yield text
        return
    for line in text.splitlines():
        if line.strip():
            yield line


def _parquet(path, text_field):
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise ImportError("%s: reading Parquet needs pyarrow (pip install pyarrow)" % path) from None
    try:
        table = pyarrow.parquet.ParquetFile(path)
    except pyarrow.ArrowException as e:
        raise ValueError("%s: not a Parquet file (%s)" % (path, e)) from None
    schema = table.schema_arrow
    if text_field not in schema.names:
        raise ValueError("%s: no %r column (its columns: %s; give text_field=)"
                         % (path, text_field, ", ".join(schema.names)))
    kind = schema.field(text_field).type
    if not (pyarrow.types.is_string(kind) or pyarrow.types.is_large_string(kind)):
        raise ValueError("%s: column %r is %s, not text" % (path, text_field, kind))
    row = 0
    for batch in table.iter_batches(columns=[text_field], batch_size=4096):
        for text in batch.column(0).to_pylist():
            if text is None:
                raise ValueError("%s: row %d (counting from 0): %r is null" % (path, row, text_field))
            row += 1
            yield text


def _stoker_dataset(location, text_field):
    from . import Loader, Text
    key = text_field if text_field != "text" else "txt"
    loader = Loader(location, batch_size=256, shuffle=False, fields={"text": Text(key)}, log_epochs=False)
    for batch in loader:
        yield from batch["text"]


def documents(inputs, text_field, lines):
    """Every document's text, input by input, in order."""
    for source in inputs:
        source = os.fspath(source)
        name = source
        for suffix in _COMPRESSIONS:
            if name.endswith(suffix):
                name = name[:-len(suffix)]
                break
        if name.endswith(".jsonl") or name.endswith(".json"):
            yield from _jsonl(source, text_field)
        elif name.endswith(".txt"):
            yield from _text_file(source, lines)
        elif source.endswith(".parquet"):
            yield from _parquet(source, text_field)
        elif os.path.isdir(source) or "://" in source or source.endswith(".stoker"):
            yield from _stoker_dataset(source, text_field)
        else:
            raise ValueError("%s: cannot tell what it is (expected %s)" % (source, _KINDS))
