#include "codec/exif.h"

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace stoker::codec {
namespace {

// A JPEG prefix: SOI, an APP1 "Exif" block with one IFD0 entry, then SOS.
std::vector<std::byte> WithExif(std::uint16_t tag, std::uint16_t type, std::uint32_t count, std::uint16_t value,
                                bool big_endian, std::string before = {}) {
  std::string tiff;
  auto u16 = [&](std::uint16_t v) {
    if (big_endian) {
      tiff += static_cast<char>(v >> 8);
      tiff += static_cast<char>(v & 0xFF);
    } else {
      tiff += static_cast<char>(v & 0xFF);
      tiff += static_cast<char>(v >> 8);
    }
  };
  auto u32 = [&](std::uint32_t v) {
    if (big_endian) {
      u16(static_cast<std::uint16_t>(v >> 16));
      u16(static_cast<std::uint16_t>(v));
    } else {
      u16(static_cast<std::uint16_t>(v));
      u16(static_cast<std::uint16_t>(v >> 16));
    }
  };
  tiff += big_endian ? "MM" : "II";
  u16(42);
  u32(8);
  u16(2);                               // two entries: another tag first
  u16(0x010F), u16(2), u32(4), u32(0);  // Make, ASCII
  u16(tag), u16(type), u32(count), u16(value), u16(0);
  u32(0);
  std::string app1 = std::string("Exif\0\0", 6) + tiff;
  std::string jpeg = "\xFF\xD8" + before;
  jpeg += "\xFF\xE1";
  jpeg += static_cast<char>((app1.size() + 2) >> 8);
  jpeg += static_cast<char>((app1.size() + 2) & 0xFF);
  jpeg += app1;
  jpeg += std::string("\xFF\xDA\x00\x02", 4);
  std::vector<std::byte> out(jpeg.size());
  for (std::size_t i = 0; i < jpeg.size(); ++i) out[i] = static_cast<std::byte>(jpeg[i]);
  return out;
}

TEST(ExifOrientation, ReadsBothByteOrders) {
  for (std::uint16_t v = 1; v <= 8; ++v) {
    EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 1, v, false)), v);
    EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 1, v, true)), v);
  }
  // Behind a JFIF APP0 block.
  const std::string app0("\xFF\xE0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00", 18);
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 1, 6, false, app0)), 6);
}

TEST(ExifOrientation, AnythingUnreadableIsOne) {
  EXPECT_EQ(JpegExifOrientation({}), 1);
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 1, 9, false)), 1);  // out of range
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 1, 0, false)), 1);
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 4, 1, 6, false)), 1);  // LONG, not SHORT
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0112, 3, 2, 6, false)), 1);  // two values
  EXPECT_EQ(JpegExifOrientation(WithExif(0x0110, 3, 1, 6, false)), 1);  // another tag
  auto good = WithExif(0x0112, 3, 1, 6, false);
  for (std::size_t cut = 0; cut < good.size(); ++cut) {  // every truncation: no crash, 1 or 6
    const int o = JpegExifOrientation(std::span(good).first(cut));
    EXPECT_TRUE(o == 1 || o == 6) << cut;
  }
  auto bad_offset = good;
  bad_offset[2 + 2 + 2 + 6 + 4] = std::byte{0xFF};  // IFD offset far past the block
  EXPECT_EQ(JpegExifOrientation(bad_offset), 1);
}

}  // namespace
}  // namespace stoker::codec
