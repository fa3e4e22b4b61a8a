"""Bytes that pass stoker's image header check (pack, index, DatasetWriter)
without being a whole image: for tests of naming, indexing and layout,
where the pixels do not matter. They do not decode."""

# An 8x8 grey JPEG's header up to its scan (SOI, SOF0, SOS), and a PNG's
# signature and IHDR chunk (8x8, 8-bit grey), as tests/test_util.h's FakeImage.
JPEG_HEADER = bytes.fromhex("ffd8ffc0000b080008000801011100ffda0008010100003f00")
PNG_HEADER = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000008000000080800000000e164e157")


def fake_image(name, tail):
    """The header the name's extension calls for, then `tail`."""
    return (PNG_HEADER if name.lower().endswith(".png") else JPEG_HEADER) + tail
