"""stoker.DatasetWriter: see its docstring."""
import io
import json
import math
import numbers
import os
import warnings

from . import _native, _params
from ._text import counted
from .checkpoint import parse_size

_NPY_MAGIC = b"\x93NUMPY"
# Pillow's formats for the image extensions; PNG and WebP are written
# losslessly, JPEG at _JPEG_QUALITY.
_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "tif": "TIFF", "tiff": "TIFF",
                "ppm": "PPM", "pgm": "PPM", "bmp": "BMP"}
_JPEG_QUALITY = 95


def _extension(name):
    return name.rsplit(".", 1)[-1]


def _is_metadata(name):
    # WebDataset's own entries in a sample dict (__key__, __url__, __local_path__).
    return len(name) >= 4 and name.startswith("__") and name.endswith("__")


def _is_pil_image(value):
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


def _numpy_array(value):
    """``value`` as a NumPy array when it is one, a NumPy scalar or a torch
    tensor; None otherwise."""
    module = type(value).__module__
    if module == "numpy" or module.startswith("numpy."):
        import numpy
        return numpy.asarray(value)
    if module.startswith("torch") and hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return None


def _bytes_like(value):
    return isinstance(value, (bytes, bytearray, memoryview))


class _FieldError(ValueError):
    pass


def _pillow_tiff(array):
    # What Pillow writes as a TIFF image: uint8 gray, RGB or RGBA, uint16 gray.
    return (array.dtype.name == "uint8" and (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4)))) or \
        (array.dtype.name == "uint16" and array.ndim == 2)


def _tiff_array_bytes(array):
    """A (H, W) or (H, W, S) array of any int, uint or float dtype as a
    TIFF of its samples (Deflate, lossless), as stoker.Array reads it back."""
    if array.dtype.kind not in "uif" or array.ndim not in (2, 3) or 0 in array.shape:
        raise _FieldError("a TIFF array must be (H, W) or (H, W, bands) of an int, uint or float dtype, not %s %s"
                          % (array.dtype, array.shape))
    try:
        import tifffile
    except ImportError:
        raise _FieldError("writing a %s %s array as a TIFF needs the tifffile package (pip install tifffile), or "
                          "give the TIFF's bytes" % (array.dtype, array.shape)) from None
    import numpy
    out = io.BytesIO()
    tifffile.imwrite(out, numpy.ascontiguousarray(array), photometric="minisblack",
                     planarconfig="contig" if array.ndim == 3 else None, compression="zlib", metadata=None)
    return out.getvalue()


def _image_bytes(name, value):
    if _bytes_like(value):
        return value
    if isinstance(value, dict) and set(value) <= {"bytes", "path"}:
        # Hugging Face datasets' undecoded image: {"bytes": ..., "path": ...}.
        if value.get("bytes") is not None:
            return value["bytes"]
        if value.get("path"):
            with open(value["path"], "rb") as f:
                return f.read()
        raise _FieldError("an image given as {'bytes': None, 'path': None}")
    array = _numpy_array(value)
    if array is not None and _PIL_FORMATS[_extension(name)] == "TIFF" and not _pillow_tiff(array):
        return _tiff_array_bytes(array)
    if array is not None:
        from PIL import Image
        sixteen = array.dtype.name == "uint16" and array.ndim == 2 and _PIL_FORMATS[_extension(name)] in ("PNG",
                                                                                                           "TIFF")
        if not sixteen and (array.dtype.name != "uint8" or array.ndim not in (2, 3)):
            raise _FieldError("an image array must be uint8 (H, W) or (H, W, C), or uint16 (H, W) for PNG and TIFF, "
                              "not %s %s" % (array.dtype, array.shape))
        value = Image.fromarray(array)
    if _is_pil_image(value):
        out = io.BytesIO()
        fmt = _PIL_FORMATS[_extension(name)]
        if fmt == "JPEG":
            value.save(out, format=fmt, quality=_JPEG_QUALITY)
        elif fmt == "WEBP":
            value.save(out, format=fmt, lossless=True)
        elif fmt == "TIFF":
            value.save(out, format=fmt, compression="tiff_lzw")
        elif fmt == "PPM" and value.mode not in ("L", "RGB"):
            # Pillow would drop an alpha channel, or refuse the mode: nothing is written that does not read back.
            raise _FieldError("a PGM/PPM holds gray (L) or RGB pixels, not %s; convert the image or use '.png'"
                              % value.mode)
        elif fmt == "BMP" and value.mode not in ("1", "L", "P", "RGB"):
            # Pillow writes RGBA as 32 bits that it (and stoker) reads back as RGB.
            raise _FieldError("a BMP holds 1-bit, gray (L), palette (P) or RGB pixels, not %s; convert the image or "
                              "use '.png'" % value.mode)
        else:
            value.save(out, format=fmt)
        return out.getvalue()
    raise _FieldError("an image field takes bytes, a PIL image, a uint8 array or {'bytes', 'path'}, not %s"
                      % type(value).__name__)


def _npy_bytes(value):
    if _bytes_like(value):
        if bytes(value[:6]) != _NPY_MAGIC:
            raise _FieldError("bytes that are not a .npy file (no \\x93NUMPY magic)")
        return value
    import numpy
    array = _numpy_array(value)
    if array is None:
        array = numpy.asarray(value)
    if array.dtype.hasobject:
        raise _FieldError("an array of Python objects (dtype %s): stoker does not store pickles" % array.dtype)
    out = io.BytesIO()
    numpy.save(out, array, allow_pickle=False)
    return out.getvalue()


def _json_bytes(value):
    if _bytes_like(value):
        try:
            json.loads(bytes(value))
        except ValueError as e:
            raise _FieldError("bytes that are not JSON (%s)" % e) from None
        return value
    array = _numpy_array(value)
    if array is not None:
        value = array.tolist()
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except (TypeError, ValueError) as e:
        raise _FieldError("a value JSON cannot hold (%s)" % e) from None


def _text_bytes(value):
    if isinstance(value, str):
        return value.encode("utf-8")
    if _bytes_like(value):
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError as e:
            raise _FieldError("bytes that are not UTF-8 (%s)" % e) from None
        return value
    raise _FieldError("a text field takes str, not %s" % type(value).__name__)


def _int_text(value):
    array = _numpy_array(value)
    if array is not None and array.ndim == 0:
        value = array.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _FieldError("an integer field takes an int, not %r" % (value,))
    return str(int(value)).encode()


def _int_field(value):
    if type(value) is int:  # the common case, without the checks below
        return str(value).encode()
    if isinstance(value, (str, bytes)):
        try:
            value = int(value.strip())
        except ValueError:
            raise _FieldError("an integer field takes an int, not %r" % (value,)) from None
    return _int_text(value)


def _text_field(value):
    if type(value) is str:
        return value.encode("utf-8")
    return _text_bytes(value)


# What a field's name says about its value, by name: the same names come in
# every sample. At most _MAX_ENCODERS names are kept.
_encoders = {}
_MAX_ENCODERS = 4096


def _encoder(name):
    """function(name, value) -> (payload, stoker's FieldKind) for field ``name``."""
    encoder = _encoders.get(name)
    if encoder is not None:
        return encoder
    K = _native.FieldKind
    kind = _native.conventional_field_kind(name)
    by_kind = {K.image: _image_bytes, K.array: lambda _, v: _npy_bytes(v), K.json: lambda _, v: _json_bytes(v),
               K.text: lambda _, v: _text_field(v), K.int: lambda _, v: _int_field(v)}
    payload = by_kind.get(kind)
    encoder = _encode_by_value if payload is None else (lambda n, v: (payload(n, v), kind))
    if len(_encoders) < _MAX_ENCODERS:
        _encoders[name] = encoder
    return encoder


def _encode_by_value(name, value):
    """A name without a known extension: what is stored follows the value."""
    K = _native.FieldKind
    if _bytes_like(value):
        return value, K.bytes
    if isinstance(value, str):
        return value.encode("utf-8"), K.text
    array = _numpy_array(value)
    if array is not None:
        if array.ndim != 0:
            raise _FieldError("an array needs a name ending in .npy (e.g. '%s.npy'), which says how to read it"
                              % name)
        value = array.item()
    if isinstance(value, bool):
        return b"true" if value else b"false", K.json
    if isinstance(value, numbers.Integral):
        return str(int(value)).encode(), K.int
    if isinstance(value, numbers.Real):
        if not math.isfinite(value):
            raise _FieldError("%r: a number field must be finite" % value)
        return repr(float(value)).encode(), K.float
    if isinstance(value, (dict, list, tuple)):
        return _json_bytes(value), K.json
    if _is_pil_image(value):
        raise _FieldError("a PIL image needs a name ending in .png, .webp, .tif or .jpg (e.g. '%s.png'), which "
                          "says how to encode it" % name)
    raise _FieldError("cannot store a %s; give bytes, str, a number, a dict or list (JSON), an array under a "
                      "'.npy' name or an image under an image name" % type(value).__name__)


class DatasetWriter:
    """Writes a dataset sample by sample, from Python: the dataset ``stoker
    pack`` makes (indexed WebDataset tar shards), for data that is not in
    files, such as a Hugging Face dataset, a database or samples made on the
    fly::

        with stoker.DatasetWriter("out", class_names=names) as writer:
            for i, row in enumerate(rows):
                writer.write({"__key__": "%08d" % i, "jpg": row["image"], "cls": row["label"],
                              "boxes.npy": numpy.asarray(row["boxes"], "float32"), "txt": row["caption"]})
        loader = stoker.Loader("out", ...)

    Each sample is a dict of field name -> value, named as WebDataset names
    a sample's files ("jpg", "cls", "mask.png", "boxes.npy"). ``__key__``
    is the sample's key (unique; default: its position, zero-padded); other
    ``__*__`` entries (WebDataset's ``__url__``) and None values are left
    out. The name's extension says how a value is stored:

    - ``jpg``/``jpeg``/``png``/``webp``/``tif``/``tiff``/``ppm``/``pgm``/``bmp``: bytes as they
      are (kept exactly); a PIL image or a uint8 (H, W[, C]) array is encoded, PNG, WebP,
      TIFF (LZW), PGM/PPM and BMP (gray or RGB) losslessly, JPEG at quality 95; under a TIFF
      name, any other (H, W) or (H, W, bands) int, uint or float array is written with
      tifffile (Deflate), as ``stoker.Array`` reads it back; Hugging Face's undecoded
      ``{"bytes": ..., "path": ...}`` is stored as its bytes (or its file's).
    - ``npy``: a NumPy array, scalar or torch tensor (``numpy.save``, no
      pickles); bytes must be a ``.npy`` file already.
    - ``json``: any JSON value (``json.dumps``); bytes must parse.
    - ``txt``: str (UTF-8). ``cls``/``id``/``idx``/``index``/``label``: an
      integer; ``cls`` is the sample's label.
    - any other name: bytes as they are, str as text, int and float as
      numbers (read with ``stoker.Int``/``stoker.Float``), bool, dict, list
      as JSON.

    Shards of about ``shard_size`` (bytes or a string such as "64MiB") are
    written under temporary names and renamed; ``close()`` writes the index
    last and returns a summary dict. A writer closed by an exception in its
    ``with`` block, or dropped unclosed, removes what it wrote, so a folder
    never looks like a dataset that is missing samples. Without
    ``overwrite``, a folder holding a dataset is refused. ``class_names``:
    label i's name, kept in the index (``stoker inspect`` shows it). The same
    samples give byte-identical files. A process forked from the writer's
    (multiprocessing with "fork") cannot write to it and its copy removes
    nothing: give each process a writer and folder of its own. Samples are
    stored in the order
    written: to mix classes across shards, write them in a random order (or
    repack with ``stoker pack OUT OUT2 --shuffle``).

    Image fields are checked as ``stoker pack`` checks them, the format by
    the first bytes and then the header: bytes that fail (empty, not an
    image, a GIF, a cut header) are a ValueError naming the sample and
    field, since the loader would fail on them later.
    ``keep_bad_images=True`` stores them as they are; ``close()``'s summary
    counts them (``bad_images_kept``) and lists the 1,000 smallest keys
    (``bad_images_named``), and the index's note records them, so that a
    loader made over the dataset says so."""

    def __init__(self, out, shard_size=64 << 20, overwrite=False, class_names=None, keep_bad_images=False):
        size = parse_size(shard_size)
        names = [] if class_names is None else list(class_names)
        if not all(isinstance(n, str) for n in names):
            raise TypeError("class_names must be a list of str, not %r" % (class_names,))
        self._out = os.fspath(out)
        self._pid = os.getpid()
        self._native = _native.DatasetWriter(self._out, size, _params.boolean("overwrite", overwrite), names,
                                             _params.boolean("keep_bad_images", keep_bad_images))
        self._summary = None

    @property
    def samples(self):
        """How many samples were written so far."""
        if self._native is not None:
            return self._native.samples
        return self._summary["samples"] if self._summary is not None else 0  # aborted: nothing kept

    def write(self, sample):
        """Appends one sample (a dict; see the class). A bad key, field name
        or value is a ValueError or TypeError naming the sample and field, and
        leaves the writer as it was."""
        if self._native is None:
            raise ValueError("this DatasetWriter is closed")
        if not isinstance(sample, dict):
            raise TypeError("a sample is a dict of field name -> value, not %s" % type(sample).__name__)
        key = sample.get("__key__")
        if key is None:
            key = "%09d" % self._native.samples
        elif not isinstance(key, str):
            raise TypeError("__key__ must be a str, not %r" % (key,))
        fields = []
        for name, value in sample.items():
            if not isinstance(name, str):
                raise TypeError("sample %r: field names are str, not %r" % (key, name))
            if _is_metadata(name) or value is None:
                continue
            try:
                payload, kind = _encoder(name)(name, value)
            except _FieldError as e:
                raise ValueError("sample %r, field %r: %s" % (key, name, e)) from None
            except (TypeError, ValueError) as e:  # from NumPy, Pillow or torch (a bfloat16 tensor, an odd image)
                raise type(e)("sample %r, field %r: %s" % (key, name, e)) from None
            fields.append((name, payload, kind))
        self._native.add(key, fields)  # checks image fields as pack does (keep_bad_images)

    def close(self):
        """Ends the last shard and writes the index; returns the summary
        ({"samples", "shards", "shard_bytes", "payload_bytes", "index_path",
        ...}). Closing again returns it again."""
        if self._native is None:
            if self._summary is None:
                raise ValueError("this DatasetWriter was aborted; nothing was kept")
            return self._summary
        try:
            self._summary = self._native.finish()
        finally:
            self._native = None  # on failure, dropping it removes what it wrote
        return self._summary

    def abort(self):
        """Drops the dataset: removes the shards written so far, writes no
        index."""
        self._native = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:
            self.abort()
        return False

    def __del__(self):
        # A forked child's copy removes nothing (the native side checks too): no warning there.
        if getattr(self, "_native", None) is not None and getattr(self, "_pid", None) == os.getpid():
            warnings.warn("stoker.DatasetWriter(%r) was dropped without close(): the %s written %s removed"
                          % (self._out, counted(self._native.samples, "sample", "samples"),
                             "is" if self._native.samples == 1 else "are"), ResourceWarning, stacklevel=2)
