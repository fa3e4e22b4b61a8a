"""BMP images decode to Pillow's pixels (Image.open(f).convert(mode)) for
every layout Pillow reads: OS/2 and Windows headers, bottom-up and top-down,
1/4/8-bit palettes (grey ones too), 16-bit 5-5-5 and 5-6-5, 24 and 32 bits
with each bitfield layout, RLE8 and RLE4; damaged files are refused naming
what is wrong, and a packed ImageFolder of BMPs loads. Where Pillow 9.4 and
13 differ (an index past the palette; RLE deltas and odd RLE4 runs, which
9.4 misreads), stoker gives 13's pixels, checked by hand here."""
import io
import struct

import numpy as np
import pytest
from PIL import Image

import stoker

MODES = ("RGB", "L", "RGBA")


def bmp(width, height, bits, rows, palette=None, compression=0, masks=None, header=40, colors=0, top_down=False,
        raster=None):
    """A BMP file: `rows` top to bottom, each unpadded (or `raster` as it is stored)."""
    if raster is None:
        stride = ((width * bits + 31) >> 3) & ~3
        padded = [r + b"\0" * (stride - len(r)) for r in rows]
        raster = b"".join(padded if top_down else padded[::-1])
    pal = b""
    if palette is not None:
        pal = b"".join(bytes((b, g, r)) + (b"" if header == 12 else b"\0") for r, g, b in palette)
    extra = b""
    if header == 12:
        info = struct.pack("<IHHHH", 12, width, height, 1, bits)
    else:
        info = struct.pack("<IiiHHIIiiII", header, width, -height if top_down else height, 1, bits, compression,
                           len(raster), 2835, 2835, colors, 0)
        if header > 40:
            m = list(masks or (0, 0, 0, 0)) + [0] * 4
            info += struct.pack("<IIII", *m[:4]) + b"\0" * (header - 56)
        elif masks is not None:
            extra = b"".join(struct.pack("<I", m) for m in masks[:3])
    offset = 14 + len(info) + len(extra) + len(pal)
    return b"BM" + struct.pack("<IHHI", offset + len(raster), 0, 0, offset) + info + extra + pal + raster


def rng_bytes(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def cases():
    w, h = 13, 7
    rng = np.random.default_rng(3)
    colour_palette = [tuple(int(v) for v in rng.integers(0, 256, 3)) for _ in range(256)]
    out = []
    for top_down in (False, True):
        for bits in (1, 4, 8):
            n = 1 << bits
            row_bytes = (w * bits + 7) // 8
            rows = [rng_bytes(row_bytes, 10 * bits + y) for y in range(h)]
            out.append(("%d-bit palette" % bits, bmp(w, h, bits, rows, colour_palette[:n], top_down=top_down)))
            grey = [(0, 0, 0), (255, 255, 255)] if n == 2 else [(i, i, i) for i in range(n)]
            if bits != 4:  # Pillow reads a 4-bit palette of greys 0-15 as 8-bit data, and fails
                out.append(("%d-bit grey palette" % bits, bmp(w, h, bits, rows, grey, top_down=top_down)))
        # A short palette, every index in it (past it: below).
        rows8 = [bytes(v % 20 for v in rng_bytes(w, 50 + y)) for y in range(h)]
        out.append(("8-bit, 20 colours", bmp(w, h, 8, rows8, colour_palette[:20], colors=20, top_down=top_down)))
        rows16 = [rng_bytes(2 * w, 60 + y) for y in range(h)]
        out.append(("16-bit 5-5-5", bmp(w, h, 16, rows16, top_down=top_down)))
        out.append(("16-bit 5-6-5 bitfields", bmp(w, h, 16, rows16, compression=3, masks=(0xF800, 0x7E0, 0x1F),
                                                  top_down=top_down)))
        out.append(("16-bit 5-5-5 bitfields v4", bmp(w, h, 16, rows16, compression=3, header=108,
                                                     masks=(0x7C00, 0x3E0, 0x1F, 0), top_down=top_down)))
        rows24 = [rng_bytes(3 * w, 70 + y) for y in range(h)]
        out.append(("24-bit", bmp(w, h, 24, rows24, top_down=top_down)))
        out.append(("24-bit bitfields", bmp(w, h, 24, rows24, compression=3, masks=(0xFF0000, 0xFF00, 0xFF),
                                            top_down=top_down)))
        rows32 = [rng_bytes(4 * w, 80 + y) for y in range(h)]
        out.append(("32-bit", bmp(w, h, 32, rows32, top_down=top_down)))
        for masks in ((0xFF0000, 0xFF00, 0xFF, 0), (0xFF000000, 0xFF0000, 0xFF00, 0), (0xFF000000, 0xFF0000, 0xFF00, 0xFF),
                      (0xFF, 0xFF00, 0xFF0000, 0xFF000000), (0xFF0000, 0xFF00, 0xFF, 0xFF000000), (0, 0, 0, 0)):
            out.append(("32-bit bitfields %s" % ["%x" % m for m in masks],
                        bmp(w, h, 32, rows32, compression=3, header=124, masks=masks, top_down=top_down)))
    # OS/2 1.x: 16-bit sizes, 3-byte palette entries.
    out.append(("OS/2 8-bit", bmp(w, h, 8, [rng_bytes(w, 90 + y) for y in range(h)], colour_palette, header=12)))
    out.append(("OS/2 24-bit", bmp(w, h, 24, [rng_bytes(3 * w, 95 + y) for y in range(h)], header=12)))
    # Run-length: runs, a run clipped at the row's end, absolute runs (padded to 16 bits), end of line,
    # end of bitmap (deltas: below, as Pillow 9.4 misreads them).
    rle8 = (bytes([3, 7, 0, 5, 1, 2, 3, 4, 5, 0, 20, 9, 0, 0]) + bytes([0, 3, 9, 8, 7, 0, 4, 6]) + bytes([0, 0])
            + bytes([2, 5, 0, 0]) + bytes([13, 200, 0, 0]) * 4 + bytes([0, 1]))
    out.append(("RLE8", bmp(w, h, 8, None, colour_palette, compression=1, raster=rle8)))
    rle4 = (bytes([5, 0x3A, 0, 6, 0x12, 0x34, 0x56, 0, 0, 0]) + bytes([0, 4, 0xAB, 0xCD, 0, 0]) + bytes([13, 0x77, 0, 0]) * 5
            + bytes([0, 1]))
    out.append(("RLE4", bmp(w, h, 4, None, colour_palette[:16], compression=2, raster=rle4)))
    return out


def test_every_bmp_layout_decodes_to_pillows_pixels():
    for label, data in cases():
        reference = Image.open(io.BytesIO(data))
        for mode in MODES:
            ref = np.asarray(reference.convert(mode))
            ours = stoker.decode_image(data, mode=mode).numpy()
            assert ours.shape == (ref.shape[0], ref.shape[1], 1 if ref.ndim == 2 else ref.shape[2]), (label, mode)
            assert np.array_equal(ours.reshape(ref.shape), ref), (label, mode)


def test_pillows_own_bmps_decode_to_its_pixels(demo_images):
    photo = Image.open(sorted(demo_images.rglob("*.JPEG"))[0]).convert("RGB")
    for image in (photo, photo.convert("L"), photo.convert("P"), photo.convert("1")):
        buf = io.BytesIO()
        image.save(buf, "BMP")
        for mode in MODES:
            ref = np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert(mode))
            ours = stoker.decode_image(buf.getvalue(), mode=mode).numpy()
            assert np.array_equal(ours.reshape(ref.shape), ref), (image.mode, mode)


def test_a_4_bit_palette_of_greys_is_read_through_the_palette():
    rows = [rng_bytes(7, y) for y in range(7)]
    data = bmp(13, 7, 4, rows, [(i, i, i) for i in range(16)])
    indices = np.array([[b >> 4 if x % 2 == 0 else b & 15 for x, b in enumerate(np.repeat(np.frombuffer(r, np.uint8), 2))]
                        for r in rows])[:, :13]
    assert np.array_equal(stoker.decode_image(data, mode="L").numpy()[..., 0], indices)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:40], "truncated or damaged BMP: 40 bytes, its header claims 40"),
    (lambda d: d[:-5], "truncated BMP: 13x7 at 24 bits needs"),
    (lambda d: d[:14] + struct.pack("<I", 52) + d[18:], "header of 52 bytes"),
    (lambda d: d[:28] + struct.pack("<H", 2) + d[30:], "of 2 bits a pixel"),
    (lambda d: d[:30] + struct.pack("<I", 4) + d[34:], "holding a JPEG"),
    (lambda d: d[:18] + struct.pack("<i", 0) + d[22:], "BMP of 0x7 pixels"),
])
def test_damaged_bmps_are_refused_naming_what_is_wrong(damage, message):
    good = bmp(13, 7, 24, [rng_bytes(39, y) for y in range(7)])
    stoker.decode_image(good)
    with pytest.raises(stoker.StokerError, match=message):
        stoker.decode_image(damage(good))


def test_run_length_data_that_ends_early_is_refused():
    data = bmp(13, 7, 8, None, [(1, 2, 3)] * 256, compression=1, raster=bytes([13, 1]) * 3 + bytes([0, 1]))
    with pytest.raises(stoker.CorruptionError, match="truncated RLE8 BMP: its run-length data fills 13 of its 13x7"):
        stoker.decode_image(data)  # without an end of line, runs past the row's end are cut to nothing
    data = bmp(13, 7, 8, None, [(1, 2, 3)] * 256, compression=1, raster=bytes([13, 1, 0, 0]) * 3 + bytes([0, 1]))
    with pytest.raises(stoker.CorruptionError, match="truncated RLE8 BMP: its run-length data fills 39 of its 13x7"):
        stoker.decode_image(data)


def test_an_index_past_the_palette_is_black_or_in_a_grey_palette_its_value():
    palette = [(10, 20, 30), (40, 50, 60), (70, 80, 90)]
    row = bytes([0, 1, 2, 3, 100, 255])
    got = stoker.decode_image(bmp(6, 1, 8, [row], palette, colors=3)).numpy()
    assert got.tolist() == [[[10, 20, 30], [40, 50, 60], [70, 80, 90], [0, 0, 0], [0, 0, 0], [0, 0, 0]]]  # Pillow 13
    got = stoker.decode_image(bmp(6, 1, 8, [row], [(i, i, i) for i in range(3)], colors=3), mode="L").numpy()
    assert got[..., 0].tolist() == [list(row)]  # a palette of greys is read as "L": the bytes themselves


def test_run_length_deltas_and_odd_rle4_absolute_runs_follow_the_format():
    # As Pillow 13 reads them (9.4 reads two more bytes for a delta, and drops an odd run's last pixel).
    palette = [(i, i, 255 - i) for i in range(256)]
    # Bottom row: 2 of index 1, a delta 3 right and 1 up, 3 of index 2, an end of line, a row of index 3.
    rle8 = bytes([2, 1, 0, 2, 3, 1, 3, 2, 0, 0, 8, 3, 0, 1])
    got = stoker.decode_image(bmp(8, 3, 8, None, palette, compression=1, raster=rle8), mode="L").numpy()[..., 0]
    want = np.zeros((3, 8), np.uint8)
    want[2, :2] = 1
    want[1, 5:8] = 2
    want[0, :] = 3
    lum = lambda i: np.asarray(Image.new("RGB", (1, 1), palette[i]).convert("L"))[0, 0]
    assert np.array_equal(got, np.vectorize(lum)(want).astype(np.uint8))
    # RLE4: an absolute run of 3 pixels in 2 bytes (then a pad byte), then an end of line, twice.
    rle4 = bytes([0, 3, 0x12, 0x30, 0, 0]) * 2 + bytes([0, 1])
    got = stoker.decode_image(bmp(3, 2, 4, None, palette[:16], compression=2, raster=rle4), mode="L").numpy()[..., 0]
    assert np.array_equal(got, np.vectorize(lum)(np.array([[1, 2, 3], [1, 2, 3]])).astype(np.uint8))


def test_a_bmp_over_max_pixels_is_refused_before_decoding():
    with pytest.raises(stoker.CorruptionError, match="decompression bomb"):
        stoker.decode_image(bmp(13, 7, 24, [rng_bytes(39, y) for y in range(7)]), max_pixels=90)


def test_a_packed_tree_of_bmps_loads_as_torchvision_would(cli, demo_images, tmp_path):
    tree = tmp_path / "bmp"
    paths = sorted(demo_images.rglob("*.JPEG"))[:6]
    for n, path in enumerate(paths):
        (tree / path.parent.name).mkdir(parents=True, exist_ok=True)
        image = Image.open(path).convert("RGB")
        (image if n % 2 else image.convert("P")).save(tree / path.parent.name / ("%d.bmp" % n))
    result = cli("pack", tree, tmp_path / "packed")
    assert "not JPEG" not in result.stdout + result.stderr
    T = stoker.transforms
    transform = T.Compose([T.Resize(64), T.CenterCrop(64)])
    loader = stoker.Loader(tmp_path / "packed", batch_size=6, shuffle=False, transform=transform, dtype="uint8",
                           layout="NHWC", log_epochs=False)
    images, labels = next(iter(loader))
    files = sorted(tree.rglob("*.bmp"), key=lambda p: (p.parent.name, p.stem))
    for image, path in zip(images, files):
        ours, _ = T.apply(path.read_bytes(), transform, dtype="uint8")
        assert np.array_equal(image.numpy(), ours.numpy()), path
    fields = stoker.Loader(tmp_path / "packed", batch_size=6, shuffle=False, log_epochs=False,
                           fields={"image": stoker.Image("bmp", mode="RGB")})
    batch = next(iter(fields))
    for image, path in zip(batch["image"], files):
        assert np.array_equal(image.numpy(), np.asarray(Image.open(path).convert("RGB"))), path
