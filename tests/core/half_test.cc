// The one float -> half / bfloat16 conversion (core/half.h), used by the
// CPU's output writer, the GPU kernel and its CPU twin.
#include "core/half.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include <gtest/gtest.h>

namespace stoker {
namespace {

TEST(Half, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(1e6f), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(5.960464477539063e-08f), 0x0001);  // the smallest subnormal
  EXPECT_EQ(FloatToHalfBits(1.0f + 1.0f / 2048), 0x3c00);      // a tie: to even
  EXPECT_EQ(FloatToHalfBits(1.0f + 3.0f / 2048), 0x3c02);      // a tie: to even (up)
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(std::nanf("")) & 0x7e00, 0x7e00);  // NaN stays NaN
  for (float f : {0.0f, 0.5f, -1.75f, 3.140625f, 1000.0f, 6.1035156e-05f})
    EXPECT_EQ(HalfBitsToFloat(FloatToHalfBits(f)), f);
}

TEST(Half, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x3f808000u)), 0x3f80);  // a tie: to even
  EXPECT_EQ(FloatToBFloat16Bits(std::bit_cast<float>(0x3f818000u)), 0x3f82);  // a tie: to even (up)
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(std::nanf("")))));
  for (float f : {0.0f, 0.5f, -1.75f, 3.140625f}) EXPECT_EQ(BFloat16BitsToFloat(FloatToBFloat16Bits(f)), f);
}

// Every half value survives half -> float -> half exactly.
TEST(Half, EveryHalfRoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = HalfBitsToFloat(bits);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), bits) << std::hex << h;
  }
}

}  // namespace
}  // namespace stoker
