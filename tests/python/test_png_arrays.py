"""PNGs as arrays (stoker.Array over a .png field, stoker.decode_array):
every color type and bit depth, interlaced or not, decodes to its samples
as stored (the array the test encoder was given: no colour interpreted,
1- to 4-bit samples unscaled, palette images as their indices, 16-bit kept
whole), and agrees with NumPy over Pillow where Pillow keeps the samples;
through the loader a 16-bit depth PNG is read, stacked and follows the
image. Damaged files are named."""
import io
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

import png_writer
import stoker

rng = np.random.default_rng(29)
COMBOS = [(png_writer.GRAY, d) for d in (1, 2, 4, 8, 16)] + [(png_writer.PALETTE, d) for d in (1, 2, 4, 8)] + \
    [(t, d) for t in (png_writer.RGB, png_writer.GRAY_ALPHA, png_writer.RGBA) for d in (8, 16)]


def samples(color_type, depth, h=13, w=21):
    channels = png_writer.CHANNELS[color_type]
    high = (1 << depth) - 1
    shape = (h, w) if channels == 1 else (h, w, channels)
    return rng.integers(0, high, shape, endpoint=True).astype(np.uint16 if depth == 16 else np.uint8)


@pytest.mark.parametrize("color_type, depth", COMBOS)
@pytest.mark.parametrize("interlace", [False, True])
def test_every_color_type_and_depth_decodes_to_its_samples(color_type, depth, interlace):
    image = samples(color_type, depth)
    palette = [(i, 255 - i, i // 2) for i in range(1 << depth)] if color_type == png_writer.PALETTE else None
    data = png_writer.encode(image, color_type, depth, interlace=interlace, palette=palette)
    got = stoker.decode_array(data)
    assert tuple(got.shape) == image.shape
    assert got.dtype == (torch.int32 if depth == 16 else torch.uint8)  # torch 1.13 has no uint16
    np.testing.assert_array_equal(got.numpy(), image.astype(got.numpy().dtype))


@pytest.mark.parametrize("mode, dtype", [("L", np.uint8), ("I;16", np.uint16), ("RGB", np.uint8),
                                         ("RGBA", np.uint8), ("LA", np.uint8), ("P", np.uint8)])
def test_pillows_files_read_as_numpy_reads_them(mode, dtype):
    shape = (17, 11) if mode in ("L", "I;16", "P") else (17, 11, len(mode))
    values = rng.integers(0, 4000 if mode == "I;16" else 255, shape, endpoint=True).astype(dtype)
    image = Image.fromarray(values, mode)
    if mode == "P":
        image.putpalette([v for i in range(256) for v in (i, i // 3, 255 - i)])
    buf = io.BytesIO()
    image.save(buf, "PNG")
    expected = np.asarray(Image.open(io.BytesIO(buf.getvalue())))
    got = stoker.decode_array(buf.getvalue()).numpy()
    np.testing.assert_array_equal(got, expected.astype(got.dtype))
    assert got.shape == expected.shape


def test_damaged_and_oversized_pngs_are_named():
    data = png_writer.encode(samples(png_writer.GRAY, 16), png_writer.GRAY, 16)
    at = png_writer.idat_offset(data)
    broken = data[:at + 12] + bytes([data[at + 12] ^ 0xFF]) + data[at + 13:]
    with pytest.raises(stoker.CorruptionError, match="PNG"):
        stoker.decode_array(broken)
    with pytest.raises(stoker.CorruptionError, match="PNG"):
        stoker.decode_array(data[:len(data) // 2])
    with pytest.raises(stoker.CorruptionError, match="over the limit"):
        stoker.decode_array(data, max_pixels=100)
    # What follows the image data is read to IEND: the last IDAT's CRC and a
    # cut end are checked though the image is whole before them.
    palette = [(i, i, i) for i in range(16)]
    for image in (png_writer.encode(samples(png_writer.GRAY, 16), png_writer.GRAY, 16),
                  png_writer.encode(samples(png_writer.PALETTE, 4), png_writer.PALETTE, 4, palette=palette),
                  png_writer.encode(samples(png_writer.GRAY, 2), png_writer.GRAY, 2, interlace=True)):
        stoker.decode_array(image)
        flipped = bytearray(image)
        flipped[len(image) - 13] ^= 1  # the last byte of the IDAT chunk's CRC
        for damaged in (bytes(flipped), image[:-12], image[:-13]):
            with pytest.raises(stoker.CorruptionError, match="PNG"):
                stoker.decode_array(damaged)


def member(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def test_a_16_bit_depth_png_through_the_loader(cli, tmp_path):
    """KITTI-style depth (uint16 PNG, 0 where no depth): read whole and
    stacked, and following a transformed image as the 8-bit mask does."""
    folder = tmp_path / "depth"
    folder.mkdir()
    h, w = 40, 60
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for i in range(6):
            depth = ((np.arange(h * w).reshape(h, w) * 7 + i) % 60000).astype(np.uint16)
            labels = (np.arange(h * w).reshape(h, w) % 251).astype(np.uint8)
            for ext, image in (("depth.png", Image.fromarray(depth, "I;16")), ("seg.png", Image.fromarray(labels)),
                               ("jpg", Image.fromarray(np.full((h, w, 3), 90, np.uint8)))):
                buf = io.BytesIO()
                image.save(buf, "JPEG" if ext == "jpg" else "PNG")
                member(tar, "%04d.%s" % (i, ext), buf.getvalue())
    cli("index", str(folder / "shard-000000.tar"))
    whole = next(iter(stoker.Loader(folder, batch_size=6, shuffle=False, log_epochs=False,
                                    fields={"depth": stoker.Array("depth.png")})))
    assert whole["depth"].shape == (6, h, w) and whole["depth"].dtype == torch.int32
    assert int(whole["depth"][3, 1, 2]) == (1 * w + 2) * 7 + 3
    T = stoker.transforms
    fields = {"image": stoker.Image(transform=T.Compose([T.RandomRotation(20), T.RandomResizedCrop(32),
                                                         T.RandomHorizontalFlip()])),
              "depth": stoker.Array("depth.png", follows="image", fill=65535),
              "mask": stoker.Mask("seg.png", fill=255)}
    for batch in stoker.Loader(folder, batch_size=3, seed=5, log_epochs=False, fields=fields, with_indices=True):
        depth, mask = batch["depth"].numpy(), batch["mask"].numpy()
        assert depth.shape == mask.shape == (3, 32, 32)
        filled = depth == 65535
        # Where both moved a source pixel in, the depth's index agrees with the mask's label.
        index = (depth - batch["__index__"].numpy()[:, None, None]) // 7
        assert ((index[~filled] % 251) == mask[~filled]).all()
        assert (mask[filled] == 255).all()
