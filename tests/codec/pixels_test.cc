#include "codec/pixels.h"

#include <gtest/gtest.h>

#include <cstring>

namespace stoker::codec {
namespace {

SourceImage Image(SourceMode mode, int w, int h, std::vector<std::uint8_t> data) {
  SourceImage s;
  s.mode = mode;
  s.width = w;
  s.height = h;
  s.data = std::move(data);
  s.format = "test";
  return s;
}

TEST(Pixels, LumaIsPillowsFixedPointFormula) {
  // Pillow: L = (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
  const auto src = Image(SourceMode::kRGB, 3, 1, {255, 0, 0, 0, 255, 0, 10, 200, 30});
  Pixels out;
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kL, &out).ok());
  EXPECT_EQ(out.channels, 1);
  EXPECT_EQ(out.data[0], (255 * 19595 + 0x8000) >> 16);
  EXPECT_EQ(out.data[1], (255 * 38470 + 0x8000) >> 16);
  EXPECT_EQ(out.data[2], (10 * 19595 + 200 * 38470 + 30 * 7471 + 0x8000) >> 16);
}

TEST(Pixels, AlphaIsDroppedForRgbAndKeptForRgba) {
  const auto src = Image(SourceMode::kGrayAlpha, 2, 1, {7, 100, 9, 0});
  Pixels rgb, rgba;
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kRGB, &rgb).ok());
  EXPECT_EQ(rgb.data, (std::vector<std::uint8_t>{7, 7, 7, 9, 9, 9}));
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kRGBA, &rgba).ok());
  EXPECT_EQ(rgba.data, (std::vector<std::uint8_t>{7, 7, 7, 100, 9, 9, 9, 0}));
}

TEST(Pixels, TransparentColourBecomesAlphaZero) {
  auto src = Image(SourceMode::kRGB, 2, 1, {1, 2, 3, 1, 2, 4});
  src.transparency.rgb = true;
  src.transparency.red = 1, src.transparency.green = 2, src.transparency.blue = 3;
  Pixels out;
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kRGBA, &out).ok());
  EXPECT_EQ(out.data[3], 0);
  EXPECT_EQ(out.data[7], 255);
}

TEST(Pixels, SixteenBitGrayIsClippedFor8BitModesAndKeptForI16) {
  std::vector<std::uint8_t> data(4);
  const std::uint16_t v[2] = {200, 40000};
  std::memcpy(data.data(), v, 4);
  const auto src = Image(SourceMode::kGray16, 2, 1, data);
  Pixels l, i16;
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kL, &l).ok());
  EXPECT_EQ(l.data, (std::vector<std::uint8_t>{200, 255}));
  ASSERT_TRUE(ConvertToMode(src, ColorMode::kI16, &i16).ok());
  EXPECT_EQ(i16.bytes_per_channel, 2);
  EXPECT_EQ(i16.data, data);
  Pixels refused;
  EXPECT_EQ(ConvertToMode(Image(SourceMode::kRGB, 1, 1, {1, 2, 3}), ColorMode::kI16, &refused).code(),
            StatusCode::kInvalidArgument);
}

TEST(Pixels, AWrongBufferSizeIsAnInternalErrorNotAnOverread) {
  Pixels out;
  EXPECT_EQ(ConvertToMode(Image(SourceMode::kRGB, 4, 4, {1, 2, 3}), ColorMode::kL, &out).code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace stoker::codec
