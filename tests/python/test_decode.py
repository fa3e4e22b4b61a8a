"""Field decoding (stoker.decode_image, stoker.decode_npy) against Pillow and
NumPy: every PNG color type and bit depth, palettes with tRNS, interlacing,
WebP lossy/lossless/alpha, JPEG, TIFF of every mode and compression Pillow
writes; .npy of every dtype, order and byte order;
and the damaged files each must refuse with a clear error."""
import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

import stoker
import png_writer as pw  # noqa: E402 (tests/python is on the path)

pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")
MODES = ["RGB", "L", "RGBA"]
rng = np.random.default_rng(7)


def pillow(data, mode):
    return np.asarray(Image.open(io.BytesIO(data)).convert(mode))


def ours(data, mode):
    t = stoker.decode_image(data, mode)
    assert t.dtype == (torch.int32 if mode == "I;16" else torch.uint8)
    return t.numpy()


def same_as_pillow(data, modes=MODES):
    for mode in modes:
        want = pillow(data, mode)
        got = ours(data, mode)
        if want.ndim == 2:
            want = want[:, :, None]
        assert got.shape == want.shape, (mode, got.shape, want.shape)
        assert np.array_equal(got, want.astype(got.dtype)), (mode, int((got != want).sum()), "pixels differ")


def samples(h, w, c, depth):
    return rng.integers(0, 1 << depth, size=(h, w, c))


@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("depth", [1, 2, 4, 8, 16])
def test_gray_png_of_every_depth(depth, interlace):
    image = samples(13, 17, 1, depth)
    same_as_pillow(pw.encode(image, pw.GRAY, depth, interlace))


@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("color_type", [pw.RGB, pw.GRAY_ALPHA, pw.RGBA])
@pytest.mark.parametrize("depth", [8, 16])
def test_color_and_alpha_png(color_type, depth, interlace):
    image = samples(11, 19, pw.CHANNELS[color_type], depth)
    same_as_pillow(pw.encode(image, color_type, depth, interlace))


@pytest.mark.parametrize("interlace", [False, True])
@pytest.mark.parametrize("depth", [1, 2, 4, 8])
@pytest.mark.parametrize("with_trns", [False, True])
def test_palette_png_with_and_without_trns(depth, with_trns, interlace):
    colours = 1 << depth
    palette = [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(colours)]
    # tRNS may be shorter than the palette: the rest are opaque.
    trns = bytes(int(v) for v in rng.integers(0, 256, max(1, colours // 2))) if with_trns else None
    image = samples(9, 23, 1, depth)
    same_as_pillow(pw.encode(image, pw.PALETTE, depth, interlace, palette=palette, trns=trns))


@pytest.mark.parametrize("depth", [8, 16])
def test_trns_of_gray_and_rgb_png_is_alpha_in_rgba(depth):
    gray = samples(8, 8, 1, depth)
    gray[0, 0, 0] = 5
    same_as_pillow(pw.encode(gray, pw.GRAY, depth, trns=struct.pack(">H", 5)))
    rgb = samples(8, 8, 3, depth)
    rgb[1, 1] = (1, 2, 3)
    same_as_pillow(pw.encode(rgb, pw.RGB, depth, trns=struct.pack(">HHH", 1, 2, 3)))


def test_sixteen_bit_gray_keeps_its_bits_in_mode_i16():
    image = samples(7, 9, 1, 16)
    data = pw.encode(image, pw.GRAY, 16, interlace=True)
    got = ours(data, "I;16")
    assert got.shape == (7, 9, 1)
    assert np.array_equal(got[:, :, 0], image[:, :, 0])
    assert np.array_equal(got[:, :, 0], np.asarray(Image.open(io.BytesIO(data)).convert("I;16")))
    eight = pw.encode(samples(5, 5, 1, 8), pw.GRAY, 8)
    assert np.array_equal(ours(eight, "I;16")[:, :, 0], np.asarray(Image.open(io.BytesIO(eight)).convert("I;16")))
    with pytest.raises(ValueError, match="I;16 takes grayscale"):
        stoker.decode_image(pw.encode(samples(4, 4, 3, 8), pw.RGB, 8), "I;16")


def test_pillow_written_pngs():
    base = Image.fromarray(rng.integers(0, 256, (21, 33, 3), dtype=np.uint8))
    for mode in ["1", "L", "LA", "P", "RGB", "RGBA", "I"]:
        buf = io.BytesIO()
        image = base.convert(mode)
        if mode == "I":  # 16-bit gray, from uint16 (mode I;16): Pillow 13 writes no PNG from mode I
            image = Image.fromarray(rng.integers(0, 65536, (21, 33)).astype(np.uint16))
        image.save(buf, "PNG", optimize=mode == "P")
        same_as_pillow(buf.getvalue())


@pytest.mark.parametrize("lossless", [False, True])
@pytest.mark.parametrize("alpha", [False, True])
def test_webp(lossless, alpha):
    # Smooth content, as photos are: lossy WebP's chroma upsampling shows.
    y, x = np.mgrid[0:37, 0:53]
    rgb = np.stack([x * 4, y * 6, (x + y) * 2], axis=2).astype(np.uint8)
    image = Image.fromarray(rgb)
    if alpha:
        image.putalpha(Image.fromarray((x * y % 256).astype(np.uint8)))
    buf = io.BytesIO()
    image.save(buf, "WEBP", lossless=lossless, quality=80)
    same_as_pillow(buf.getvalue())


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_jpeg(mode):
    y, x = np.mgrid[0:40, 0:56]
    image = Image.fromarray(np.stack([x * 4, y * 6, (x + y) * 2], axis=2).astype(np.uint8)).convert(mode)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=85)
    same_as_pillow(buf.getvalue())


@pytest.mark.parametrize("compression", [None, "tiff_lzw", "tiff_adobe_deflate", "packbits", "jpeg", "group4"])
@pytest.mark.parametrize("mode", ["1", "L", "LA", "P", "RGB", "RGBA", "I;16"])
def test_pillow_written_tiffs(mode, compression):
    if (compression == "jpeg" and mode not in ("L", "RGB")) or (compression == "group4" and mode != "1"):
        pytest.skip("Pillow writes no such TIFF")
    base = Image.fromarray(rng.integers(0, 256, (21, 33, 3), dtype=np.uint8))
    image = base.convert(mode) if mode != "I;16" else Image.fromarray(
        rng.integers(0, 65536, (21, 33)).astype(np.uint16))
    if mode == "P":
        image = base.convert("P", palette=Image.ADAPTIVE, colors=37)
    buf = io.BytesIO()
    image.save(buf, "TIFF", compression=compression)
    data = buf.getvalue()
    same_as_pillow(data, MODES + (["I;16"] if mode == "I;16" else []))
    # Several pages: the first, as Image.open gives it.
    second = io.BytesIO()
    image.save(second, "TIFF", compression=compression, save_all=True, append_images=[image.rotate(90, expand=True)])
    same_as_pillow(second.getvalue())


def test_tiffs_stoker_does_not_decode_are_refused_naming_what_they_hold():
    buf = io.BytesIO()
    Image.fromarray(rng.random((8, 9), dtype=np.float32)).save(buf, "TIFF")
    damaged("32-bit floating-point samples.*stoker.Array", buf.getvalue(), error=stoker.StokerError)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (8, 9, 3), dtype=np.uint8)).convert("CMYK").save(buf, "TIFF")
    damaged("CMYK", buf.getvalue(), error=stoker.StokerError)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (8, 9, 3), dtype=np.uint8)).save(buf, "TIFF", compression="tiff_lzw")
    damaged("TIFF", buf.getvalue()[:len(buf.getvalue()) // 2])


def netpbm(magic, values, maxval, comment=b" # written by hand\n"):
    height, width = values.shape[:2]
    raster = values.astype(">u2" if maxval > 255 else "u1").tobytes()
    return magic + comment + b"%d %d\n%d\n" % (width, height, maxval) + raster


@pytest.mark.parametrize("maxval", [255, 100, 1, 1000, 65535])
@pytest.mark.parametrize("magic", [b"P5", b"P6"])
def test_pgm_and_ppm_decode_as_pillow_opens_them(magic, maxval):
    values = rng.integers(0, maxval + 1, (7, 11, 3 if magic == b"P6" else 1))
    values.flat[0] = maxval
    values.flat[1] = min(maxval + 9, 255 if maxval < 256 else 65535)  # over maxval: clipped, as Pillow does
    data = netpbm(magic, values, maxval)
    same_as_pillow(data, MODES + (["I;16"] if magic == b"P5" and maxval > 255 else []))
    assert Image.open(io.BytesIO(data)).format == "PPM"


@pytest.mark.parametrize("mode", ["L", "RGB", "I;16"])
def test_pillow_written_pgm_and_ppm(mode):
    image = Image.fromarray(rng.integers(0, 256, (13, 17, 3), dtype=np.uint8)).convert(mode) if mode != "I;16" else \
        Image.fromarray(rng.integers(0, 65536, (13, 17)).astype(np.uint16)).convert("I")  # saved as P5, maxval 65535
    buf = io.BytesIO()
    image.save(buf, "PPM")
    same_as_pillow(buf.getvalue(), MODES + (["I;16"] if mode == "I;16" else []))


def test_pgm_and_ppm_stoker_does_not_decode_or_that_are_damaged_are_refused():
    damaged("Netpbm P3 image \\(a plain-text form\\)", b"P3\n1 1\n255\n1 2 3\n", error=stoker.StokerError)
    damaged("Netpbm P4 image \\(a binary PBM bitmap\\)", b"P4\n8 1\n\x55", error=stoker.StokerError)
    full = netpbm(b"P6", rng.integers(0, 256, (4, 5, 3)), 255)
    damaged("truncated PGM/PPM: 5x4 needs 60 raster bytes, 59 are there", full[:-1])
    damaged("PGM/PPM maxval 70000", b"P5 2 2 70000\n" + bytes(8))
    damaged("PGM/PPM header: no number", b"P5 2 x 255\n" + bytes(4))


def damaged(message, data, mode="RGB", error=stoker.CorruptionError):
    with pytest.raises(error, match=message):
        stoker.decode_image(data, mode)


def test_damaged_images_are_refused_with_the_reason():
    png = pw.encode(samples(16, 16, 3, 8), pw.RGB, 8)
    at = pw.idat_offset(png)
    flipped = bytearray(png)
    flipped[at + 5] ^= 0x40
    damaged("PNG: damaged image data|CRC", bytes(flipped))
    damaged("PNG", png[: len(png) // 2])
    # The last IDAT's CRC and a missing IEND are checked though the image is
    # whole before them, for every colour type (once only gray and RGB files,
    # through their tRNS lookup, named as a bad tRNS chunk).
    for color_type, channels in ((pw.RGB, 3), (pw.RGBA, 4), (pw.GRAY_ALPHA, 2), (pw.GRAY, 1)):
        whole = pw.encode(samples(6, 5, channels, 8), color_type, 8)
        crc = bytearray(whole)
        crc[len(whole) - 13] ^= 1  # the last byte of IDAT's CRC
        damaged("PNG: damaged or cut after the image data", bytes(crc))
        damaged("PNG: damaged or cut after the image data", whole[:-12])
    indexed = pw.encode(samples(6, 5, 1, 8), pw.PALETTE, 8, palette=[(i, i, i) for i in range(256)])
    damaged("PNG: damaged or cut after the image data", indexed[:-12])
    # A bad CRC on an ancillary chunk is refused too.
    text = pw.encode(samples(4, 4, 3, 8), pw.RGB, 8, extra_chunks=[(b"tEXt", b"k\x00v")])
    i = text.index(b"tEXt") + 4 + 3
    damaged("PNG", text[:i] + bytes([text[i] ^ 1]) + text[i + 1:])
    # A small file claiming a huge image: refused before decoding.
    bomb = b"\x89PNG\r\n\x1a\n" + pw.chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0)) + \
        pw.chunk(b"IDAT", zlib.compress(b"\x00" * 1000)) + pw.chunk(b"IEND", b"")
    damaged("decompression bomb", bomb)
    assert stoker.decode_image(pw.encode(samples(4, 4, 3, 8), pw.RGB, 8), max_pixels=16).shape == (4, 4, 3)
    with pytest.raises(stoker.CorruptionError, match="over the limit of 15"):
        stoker.decode_image(pw.encode(samples(4, 4, 3, 8), pw.RGB, 8), max_pixels=15)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buf, "WEBP", quality=80)
    webp = buf.getvalue()
    damaged("WebP", webp[: len(webp) * 2 // 3])
    damaged("not an image", b"hello world")
    damaged("JPEG", b"\xff\xd8\xff\xe0" + b"\x00" * 40)
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "GIF")
    damaged("a GIF image: stoker decodes JPEG, PNG, WebP, TIFF, PGM, PPM and BMP", buf.getvalue(), error=stoker.StokerError)
    with pytest.raises(ValueError, match="mode 'CMYK'"):
        stoker.decode_image(png, "CMYK")


NPY_DTYPES = ["?", "i1", "u1", "<i2", ">i2", "<u2", ">u2", "<i4", ">i4", "<u4", "<i8", ">i8", "<u8", "<f2", ">f2",
              "<f4", ">f4", "<f8", ">f8"]


def npy_bytes(array, version=None):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def torch_view(array):
    """What decode_npy gives back for `array`, by the documented widening."""
    native = array.astype(array.dtype.newbyteorder("="))
    if native.dtype == np.uint16:
        native = native.astype(np.int32)
    if native.dtype in (np.uint32, np.uint64):
        native = native.astype(np.int64)
    return native


@pytest.mark.parametrize("dtype", NPY_DTYPES)
@pytest.mark.parametrize("fortran", [False, True])
def test_npy_of_every_dtype_and_order(dtype, fortran):
    shape = (3, 4, 5)
    if dtype == "?":
        array = rng.integers(0, 2, shape).astype(bool)
    elif dtype[-2] == "f":
        array = rng.standard_normal(shape).astype(dtype)
    else:
        info = np.iinfo(np.dtype(dtype))
        top = min(int(info.max), (1 << 63) - 1)  # uint64 past int64's range: refused, tested below
        array = rng.integers(info.min, top, shape, dtype=np.dtype(dtype).newbyteorder("="), endpoint=True)
        array = array.astype(dtype)
    if fortran:
        array = np.asfortranarray(array)
    got = stoker.decode_npy(npy_bytes(array))
    assert got.is_contiguous()
    assert tuple(got.shape) == shape
    want = torch_view(array)
    if dtype == "?":
        assert got.dtype == torch.bool
    assert np.array_equal(got.numpy(), want), dtype


def test_npy_shapes_and_versions():
    for array in [np.float32(3.5) * np.ones(()), np.zeros((0, 7), np.int16), np.arange(10, dtype=np.int64)]:
        got = stoker.decode_npy(npy_bytes(array))
        assert tuple(got.shape) == array.shape and np.array_equal(got.numpy(), array)
    for version in [(1, 0), (2, 0), (3, 0)]:
        array = np.arange(12, dtype="<f4").reshape(3, 4)
        assert np.array_equal(stoker.decode_npy(npy_bytes(array, version)).numpy(), array)


def test_bad_npy_is_refused_with_the_reason():
    good = npy_bytes(np.arange(12, dtype="<i4").reshape(3, 4))
    with pytest.raises(stoker.CorruptionError, match=r"shape \(3, 4\) of int32 needs 48 bytes of data; the field holds 44"):
        stoker.decode_npy(good[:-4])
    with pytest.raises(stoker.CorruptionError, match="holds 52"):
        stoker.decode_npy(good + b"\x00" * 4)
    with pytest.raises(stoker.CorruptionError, match="magic"):
        stoker.decode_npy(b"PK\x03\x04 not an npy")
    # A header whose shape overflows any size: refused, nothing allocated.
    header = b"{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }"
    header += b" " * (63 - (len(header) + 10) % 64) + b"\n"
    with pytest.raises(stoker.CorruptionError, match="needs more than"):
        stoker.decode_npy(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    with pytest.raises(stoker.StokerError, match="object arrays would run pickle"):
        buf = io.BytesIO()
        np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        stoker.decode_npy(buf.getvalue())
    with pytest.raises(stoker.StokerError, match="'<c8' is not loaded"):
        stoker.decode_npy(npy_bytes(np.zeros(3, np.complex64)))
    bad_key = good.replace(b"'fortran_order'", b"'fortran_ordeR'")
    with pytest.raises(stoker.CorruptionError, match="unexpected or repeated key 'fortran_ordeR'"):
        stoker.decode_npy(bad_key)
    uint64_big = npy_bytes(np.array([1 << 63], dtype="<u8"))
    with pytest.raises(ValueError, match="past int64's range"):
        stoker.decode_npy(uint64_big)
