// BMP: each pixel layout and header as Pillow's BmpImagePlugin reads it
// (the Python tests compare every one with Pillow itself), run-length data,
// and damage refused by name, never read past: every cut of a file either
// decodes or fails cleanly (run under the sanitizers in CI).
#include "codec/bmp.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/image_decode.h"
#include "test_util.h"

namespace stoker::codec {
namespace {

void Put16(std::string& s, std::uint32_t v) {
  s += static_cast<char>(v & 0xFF);
  s += static_cast<char>(v >> 8 & 0xFF);
}
void Put32(std::string& s, std::uint32_t v) {
  Put16(s, v & 0xFFFF);
  Put16(s, v >> 16);
}

struct BmpSpec {
  int width = 3, height = 2, bits = 24;
  std::uint32_t compression = 0;
  bool top_down = false;
  std::vector<std::uint32_t> palette;  // 0x00RRGGBB
  std::vector<std::uint32_t> masks;    // with compression 3: in a 124-byte header
  std::string raster;                  // as stored
};

// A BMP file with a 40-byte header (124 with masks).
std::string MakeBmp(const BmpSpec& spec) {
  const std::uint32_t header = spec.masks.empty() ? 40 : 124;
  std::string info;
  Put32(info, header);
  Put32(info, static_cast<std::uint32_t>(spec.width));
  Put32(info, static_cast<std::uint32_t>(spec.top_down ? -spec.height : spec.height));
  Put16(info, 1);
  Put16(info, static_cast<std::uint32_t>(spec.bits));
  Put32(info, spec.compression);
  Put32(info, static_cast<std::uint32_t>(spec.raster.size()));
  Put32(info, 2835);
  Put32(info, 2835);
  Put32(info, static_cast<std::uint32_t>(spec.palette.size()));
  Put32(info, 0);
  if (header == 124) {
    for (std::size_t i = 0; i < 4; ++i) Put32(info, i < spec.masks.size() ? spec.masks[i] : 0);
    info.resize(124, '\0');
  }
  std::string palette;
  for (std::uint32_t rgb : spec.palette) Put32(palette, rgb);  // blue, green, red, 0
  std::string file = "BM";
  const auto offset = static_cast<std::uint32_t>(14 + info.size() + palette.size());
  Put32(file, offset + static_cast<std::uint32_t>(spec.raster.size()));
  Put32(file, 0);
  Put32(file, offset);
  return file + info + palette + spec.raster;
}

TEST(Bmp, DecodesEachLayoutBottomUpAndTopDown) {
  SourceImage out;
  // 24-bit BGR, rows padded to 4 bytes, stored bottom row first.
  BmpSpec rgb;
  rgb.raster = std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09\0\0\0\x0a\x0b\x0c\x0d\x0e\x0f\x10\x11\x12\0\0\0", 24);
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(rgb)), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kRGB);
  EXPECT_EQ(out.format, "BMP");
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{12, 11, 10, 15, 14, 13, 18, 17, 16, 3, 2, 1, 6, 5, 4, 9, 8, 7}));
  rgb.top_down = true;
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(rgb)), 0, &out));
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{3, 2, 1, 6, 5, 4, 9, 8, 7, 12, 11, 10, 15, 14, 13, 18, 17, 16}));
  EXPECT_EQ(DetectImageFormat(testing::Bytes(MakeBmp(rgb))), ImageFormat::kBmp);
  ASSERT_OK_AND_ASSIGN(auto size, ImageFileSize(testing::Bytes(MakeBmp(rgb))));
  EXPECT_EQ(size.width, 3);
  EXPECT_EQ(size.height, 2);

  // 4-bit palette, high nibble first; an index past the palette is black (Pillow 13).
  BmpSpec indexed;
  indexed.bits = 4;
  indexed.height = 1;
  indexed.palette = {0x102030, 0x405060};
  indexed.raster = std::string("\x01\x90\0\0", 4);
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(indexed)), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kRGB);
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0, 0, 0}));

  // 16-bit 5-6-5 bitfields: each field scaled by v * 255 / max.
  BmpSpec wide;
  wide.bits = 16;
  wide.width = 1;
  wide.height = 1;
  wide.compression = 3;
  wide.masks = {0xF800, 0x7E0, 0x1F};
  std::string pixel;
  Put16(pixel, 31u << 11 | 32u << 5 | 1u);
  wide.raster = pixel + std::string(2, '\0');
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(wide)), 0, &out));
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{255, 32 * 255 / 63, 255 / 31}));

  // 32-bit BGRA bitfields keep alpha.
  BmpSpec alpha;
  alpha.bits = 32;
  alpha.width = 1;
  alpha.height = 1;
  alpha.compression = 3;
  alpha.masks = {0xFF0000, 0xFF00, 0xFF, 0xFF000000};
  alpha.raster = std::string("\x01\x02\x03\x80", 4);
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(alpha)), 0, &out));
  EXPECT_EQ(out.mode, SourceMode::kRGBA);
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{3, 2, 1, 0x80}));
}

TEST(Bmp, ReadsRunLengthDataAsTheFormatSays) {
  SourceImage out;
  BmpSpec rle;
  rle.bits = 8;
  rle.compression = 1;
  rle.width = 4;
  rle.height = 2;
  rle.palette = {0x000000, 0x0000FF, 0x00FF00, 0xFF0000};
  // Bottom row: a run of 1 of index 1, an absolute run of 3 (3, 2, 1; then a
  // pad byte to a 16-bit boundary), end of line; top row: a delta of 1
  // right and 0 up, a run of 3 of index 3; end of bitmap.
  rle.raster = std::string("\x01\x01\x00\x03\x03\x02\x01\x00\x00\x00\x00\x02\x01\x00\x03\x03\x00\x01", 18);
  ASSERT_OK(DecodeBmp(testing::Bytes(MakeBmp(rle)), 0, &out));
  EXPECT_EQ(out.data, (std::vector<std::uint8_t>{0, 0, 0,   255, 0, 0, 255, 0,   0, 255, 0, 0,  // top
                                                 0, 0, 255, 255, 0, 0, 0,   255, 0, 0,   0, 255}));
  // Data that ends before the image is full is refused.
  rle.raster = std::string("\x02\x01\x00\x01", 4);
  Status s = DecodeBmp(testing::Bytes(MakeBmp(rle)), 0, &out);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("fills 2 of its 4x2 pixels"), std::string::npos) << s.message();
}

TEST(Bmp, RefusesDamageAndVariantsByName) {
  SourceImage out;
  BmpSpec rgb;
  rgb.raster = std::string(24, 'x');
  const std::string good = MakeBmp(rgb);
  const auto refused = [&](const std::string& data, StatusCode code, std::string_view says) {
    Status s = DecodeBmp(testing::Bytes(data), 0, &out);
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  };
  refused(good.substr(0, good.size() - 1), StatusCode::kCorruption, "needs 24 raster bytes, 23 are there");
  refused(good.substr(0, 30), StatusCode::kCorruption, "truncated or damaged BMP");
  std::string jpeg_inside = good;
  jpeg_inside[30] = 4;
  refused(jpeg_inside, StatusCode::kUnimplemented, "holding a JPEG");
  std::string two_bits = good;
  two_bits[28] = 2;
  refused(two_bits, StatusCode::kUnimplemented, "of 2 bits a pixel");
  BmpSpec masks;
  masks.bits = 32;
  masks.compression = 3;
  masks.masks = {0xFF, 0xFF, 0xFF, 0};
  masks.raster = std::string(24, 'x');
  refused(MakeBmp(masks), StatusCode::kUnimplemented, "with bitfields 0xff 0xff 0xff 0x0");
  // A few bytes of run-length data claiming 2^31 - 1 pixels square, with no
  // pixel limit: refused, not allocated (more than a vector may hold).
  BmpSpec bomb;
  bomb.bits = 8;
  bomb.compression = 1;
  bomb.width = bomb.height = 0x7FFFFFFF;
  bomb.palette = {0x010203};
  bomb.raster = std::string("\x00\x01", 2);
  Status huge = DecodeBmp(testing::Bytes(MakeBmp(bomb)), 0, &out);
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted) << huge.ToString();
  EXPECT_NE(huge.message().find("max_image_pixels"), std::string::npos) << huge.message();
  Status s = DecodeBmp(testing::Bytes(good), 5, &out);
  EXPECT_NE(s.message().find("BMP of 3x2 = 6 pixels is over the limit of 5"), std::string::npos) << s.message();
}

// Every prefix of a file of each kind fails cleanly, or decodes to the
// whole file's pixels: nothing is read past the data (the sanitizer builds
// check it).
TEST(Bmp, EveryCutOfAFileFailsCleanly) {
  BmpSpec indexed;
  indexed.bits = 8;
  indexed.width = 5;
  indexed.height = 3;
  for (int i = 0; i < 7; ++i) indexed.palette.push_back(static_cast<std::uint32_t>(i * 0x102030));
  indexed.raster = std::string(24, '\x03');
  BmpSpec rle = indexed;
  rle.compression = 1;
  rle.raster = std::string("\x05\x01\x00\x00\x00\x03\x01\x02\x03\x00\x00\x00\x05\x04\x00\x01", 16);
  BmpSpec rle4 = rle;
  rle4.bits = 4;
  rle4.compression = 2;
  rle4.raster = std::string("\x05\x12\x00\x00\x00\x03\x12\x30\x00\x00\x05\x44\x00\x01", 14);
  for (const BmpSpec& spec : {indexed, rle, rle4}) {
    const std::string whole = MakeBmp(spec);
    SourceImage expected, out;
    ASSERT_OK(DecodeBmp(testing::Bytes(whole), 0, &expected));
    for (std::size_t cut = 0; cut < whole.size(); ++cut) {
      const std::vector<char> prefix(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(cut));
      Status s = DecodeBmp(std::span<const std::byte>(reinterpret_cast<const std::byte*>(prefix.data()), cut), 0, &out);
      // Run-length data cut after the image is full (before its end-of-bitmap) still decodes, to the same pixels.
      if (s.ok()) {
        EXPECT_NE(spec.compression, 0u) << "cut at " << cut;
        EXPECT_EQ(out.data, expected.data) << "cut at " << cut;
      }
    }
  }
}

}  // namespace
}  // namespace stoker::codec
