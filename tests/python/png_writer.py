"""A small PNG encoder for tests: every color type and bit depth, palettes,
tRNS, Adam7 interlacing, and damage on request. Pillow writes only some of
these (no 2- or 4-bit gray, no 16-bit gray+alpha, no interlacing), and
Pillow is what the decoded pixels are compared against."""
import struct
import zlib

import numpy as np

GRAY, RGB, PALETTE, GRAY_ALPHA, RGBA = 0, 2, 3, 4, 6
CHANNELS = {GRAY: 1, RGB: 3, PALETTE: 1, GRAY_ALPHA: 2, RGBA: 4}
ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _row_bytes(row, depth):
    flat = np.asarray(row).reshape(-1)
    if depth == 16:
        return flat.astype(">u2").tobytes()
    if depth == 8:
        return flat.astype(np.uint8).tobytes()
    bits = np.unpackbits(flat.astype(np.uint8)[:, None], axis=1)[:, 8 - depth:]
    return np.packbits(bits.reshape(-1)).tobytes()


def _scanlines(image, depth):
    return b"".join(b"\x00" + _row_bytes(row, depth) for row in image)


def encode(image, color_type, depth, interlace=False, palette=None, trns=None, extra_chunks=()):
    """`image`: an integer array [H, W] or [H, W, C] of samples (palette
    indices for PALETTE). `palette`: a list of (r, g, b); `trns`: the tRNS
    chunk's body as bytes."""
    image = np.asarray(image)
    if image.ndim == 2:
        image = image[:, :, None]
    h, w, c = image.shape
    assert c == CHANNELS[color_type]
    if interlace:
        raw = b""
        for x0, y0, dx, dy in ADAM7:
            sub = image[y0::dy, x0::dx]
            if sub.shape[0] and sub.shape[1]:
                raw += _scanlines(sub, depth)
    else:
        raw = _scanlines(image, depth)
    out = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, int(interlace)))
    for kind, body in extra_chunks:
        out += chunk(kind, body)
    if palette is not None:
        out += chunk(b"PLTE", b"".join(bytes(rgb) for rgb in palette))
    if trns is not None:
        out += chunk(b"tRNS", trns)
    out += chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")
    return out


def idat_offset(png):
    """Where the IDAT chunk's data starts."""
    return png.index(b"IDAT") + 4
