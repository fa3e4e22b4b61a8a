#include "codec/exif.h"

#include <cstdint>
#include <cstring>

namespace stoker::codec {
namespace {

constexpr std::uint16_t kOrientationTag = 0x0112;
constexpr std::uint16_t kTypeShort = 3;

struct Tiff {
  std::span<const std::byte> data;
  bool big_endian = false;

  bool U16(std::size_t at, std::uint16_t* out) const {
    if (at > data.size() || data.size() - at < 2) return false;
    const auto a = static_cast<std::uint16_t>(data[at]), b = static_cast<std::uint16_t>(data[at + 1]);
    *out = big_endian ? static_cast<std::uint16_t>(a << 8 | b) : static_cast<std::uint16_t>(b << 8 | a);
    return true;
  }
  bool U32(std::size_t at, std::uint32_t* out) const {
    std::uint16_t hi = 0, lo = 0;
    if (!U16(at, big_endian ? &hi : &lo) || !U16(at + 2, big_endian ? &lo : &hi)) return false;
    *out = std::uint32_t{hi} << 16 | lo;
    return true;
  }
};

// The orientation in an APP1 payload that starts with "Exif\0\0", or 1.
int OrientationFromExif(std::span<const std::byte> payload) {
  if (payload.size() < 6 || std::memcmp(payload.data(), "Exif\0\0", 6) != 0) return 1;
  Tiff tiff{payload.subspan(6)};
  if (tiff.data.size() < 8) return 1;
  if (std::memcmp(tiff.data.data(), "MM", 2) == 0) {
    tiff.big_endian = true;
  } else if (std::memcmp(tiff.data.data(), "II", 2) != 0) {
    return 1;
  }
  std::uint16_t magic = 0, count = 0;
  std::uint32_t ifd = 0;
  if (!tiff.U16(2, &magic) || magic != 42 || !tiff.U32(4, &ifd) || !tiff.U16(ifd, &count)) return 1;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::size_t entry = std::size_t{ifd} + 2 + std::size_t{i} * 12;
    std::uint16_t tag = 0, type = 0, value = 0;
    std::uint32_t n = 0;
    if (!tiff.U16(entry, &tag) || !tiff.U16(entry + 2, &type) || !tiff.U32(entry + 4, &n) ||
        !tiff.U16(entry + 8, &value))
      return 1;
    if (tag != kOrientationTag) continue;
    if (type != kTypeShort || n != 1 || value < 1 || value > 8) return 1;
    return value;
  }
  return 1;
}

}  // namespace

int JpegExifOrientation(std::span<const std::byte> jpeg) {
  auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(jpeg[i]); };
  if (jpeg.size() < 4 || byte(0) != 0xFF || byte(1) != 0xD8) return 1;
  std::size_t at = 2;
  while (at + 4 <= jpeg.size()) {
    if (byte(at) != 0xFF) return 1;  // not a marker where one must be
    const std::uint8_t marker = byte(at + 1);
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;              // start of scan or end: no EXIF before the image data
    if ((marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {  // no length
      at += 2;
      continue;
    }
    const std::size_t length = std::size_t{byte(at + 2)} << 8 | byte(at + 3);
    if (length < 2 || at + 2 + length > jpeg.size()) return 1;
    if (marker == 0xE1) {
      const int orientation = OrientationFromExif(jpeg.subspan(at + 4, length - 2));
      if (orientation != 1) return orientation;
    }
    at += 2 + length;
  }
  return 1;
}

}  // namespace stoker::codec
