"""One field's bytes to a tensor, exactly as the loader decodes it.

    stoker.decode_image(open("a.png", "rb").read(), mode="RGB")  # uint8 [H, W, 3]
    stoker.decode_npy(open("depth.npy", "rb").read())             # the array's dtype and shape
    stoker.decode_array(open("s2.tif", "rb").read())              # a TIFF's bands: [H, W, 13] uint16

The work runs without the GIL.
"""
from . import _native, _params

_MAX_PIXELS_DEFAULT = 178_956_970  # PIL's limit: 2 x Image.MAX_IMAGE_PIXELS


def _tensor(result):
    from torch.utils.dlpack import from_dlpack
    capsule, stored, delivered = result
    t = from_dlpack(capsule)
    if stored == "bool":
        t = t.bool()  # torch 1.13 reads no DLPack bool: it came as uint8
    return t


def decode_image(data, mode="RGB", max_pixels=_MAX_PIXELS_DEFAULT):
    """A JPEG, PNG, WebP, TIFF, PGM/PPM or BMP (told by its first bytes) as a uint8 tensor of
    shape [H, W, C], with the pixels of Pillow's ``Image.open(f).convert(mode)``
    for ``mode`` in "RGB", "L", "RGBA"; "I;16" keeps a grayscale image's
    16 bits ([H, W, 1], as int32: torch before 2.3 has no uint16). EXIF
    orientation is not applied, as Image.open does not. Images of more than
    ``max_pixels`` pixels (0: no limit) are refused before decoding, as
    Pillow's DecompressionBombError. Raises stoker.CorruptionError for a
    damaged image, StokerError for GIF, a BMP holding a JPEG or PNG, a TIFF
    of float, signed or CMYK samples (decode_array reads those), or an
    animated WebP."""
    limit = _params.integer("max_pixels", max_pixels, 0, _params.U64_MAX)
    if mode not in ("RGB", "L", "RGBA", "I;16"):
        raise ValueError("mode %r: RGB, L, RGBA or I;16" % (mode,))
    return _tensor(_native.decode_image(bytes(data), mode, limit))


def decode_npy(data):
    """A NumPy .npy array (bool, int, uint and float dtypes, C or Fortran
    order, either byte order) as a tensor of its shape, C-contiguous.
    uint16 and uint32 arrive widened to int32 and int64, uint64 as int64
    (values past its range are refused): torch before 2.3 has no unsigned
    types beyond uint8. Object (pickled) arrays are refused, as loading
    them would run code. Raises stoker.CorruptionError for a malformed
    file, including one whose header claims another size than its data."""
    return _tensor(_native.decode_npy(bytes(data)))


def decode_array(data, max_pixels=_MAX_PIXELS_DEFAULT):
    """What a ``stoker.Array`` field decodes: an .npy as decode_npy does, or
    a TIFF (told by its first bytes) as its samples are stored, as
    ``tifffile.imread`` gives them: 8- to 64-bit unsigned, signed or float
    samples, any number a pixel (multi-band satellite images, float
    elevation or depth, 16-bit scans), any compression libtiff has. Shape
    [H, W], [H, W, S] (contiguous) or [S, H, W] (planar), with a leading
    page axis when a file holds several full-resolution pages of one shape;
    overviews and masks are skipped. No colour is interpreted (a palette
    image gives its indices). The pixels over all pages may be at most
    ``max_pixels`` (0: no limit) and the decoded bytes 4 x max_pixels. A PNG
    gives its samples as stored too (a 16-bit depth map, a label map):
    [H, W] gray or palette indices (as NumPy gives a Pillow "P" image),
    [H, W, 2|3|4] with alpha or colour, 16 bits kept whole, 1- to 4-bit
    values unscaled. Types arrive as decode_npy's do (uint16 as int32, ...). Raises
    stoker.CorruptionError for damaged data, StokerError naming what it does
    not load (1- to 4-bit or complex samples, subsampled YCbCr)."""
    limit = _params.integer("max_pixels", max_pixels, 0, _params.U64_MAX)
    return _tensor(_native.decode_array(bytes(data), limit))
