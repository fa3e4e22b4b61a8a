#include "codec/jpeg_traits.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/jpeg.h"

namespace stoker::codec {
namespace {

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

std::string Segment(std::uint8_t marker, const std::string& payload) {
  std::string s = "\xFF";
  s += static_cast<char>(marker);
  s += static_cast<char>((payload.size() + 2) >> 8);
  s += static_cast<char>((payload.size() + 2) & 0xFF);
  return s + payload;
}

// A header: SOI, optionally Adobe APP14, then a frame header with the given sampling bytes.
std::vector<std::byte> Header(std::uint8_t sof, int precision, std::vector<int> sampling, int adobe = -1) {
  std::string jpeg = "\xFF\xD8";
  if (adobe >= 0) {
    std::string app14 = "Adobe";
    app14 += std::string("\x00\x64\x00\x00\x00\x00", 6);
    app14 += static_cast<char>(adobe);
    jpeg += Segment(0xEE, app14);
  }
  std::string frame;
  frame += static_cast<char>(precision);
  frame += std::string("\x01\x00\x02\x00", 4);  // 256 high, 512 wide
  frame += static_cast<char>(sampling.size());
  for (std::size_t c = 0; c < sampling.size(); ++c) {
    frame += static_cast<char>(c + 1);
    frame += static_cast<char>(sampling[c]);
    frame += '\0';
  }
  jpeg += Segment(sof, frame);
  jpeg += Segment(0xDA, std::string("\x01\x01\x00\x00\x3F\x00", 6));
  return Bytes(jpeg);
}

DecodeRoute Route(const std::vector<std::byte>& jpeg, bool hardware = true) {
  auto traits = ReadJpegTraits(jpeg);
  EXPECT_TRUE(traits.ok()) << traits.error().ToString();
  return PlanGpuDecode(*traits, {.hardware = hardware}).route;
}

TEST(JpegTraits, ReadsWhatEncodersWrite) {
  std::vector<std::uint8_t> rgb(64 * 32 * 3, 100);
  auto encoded = EncodeJpegRgb(rgb.data(), 64, 32, 90);
  ASSERT_TRUE(encoded.ok());
  auto traits = ReadJpegTraits(*encoded);
  ASSERT_TRUE(traits.ok()) << traits.error().ToString();
  EXPECT_EQ(traits->process, JpegProcess::kBaseline);
  EXPECT_EQ(traits->width, 64);
  EXPECT_EQ(traits->height, 32);
  EXPECT_EQ(traits->components, 3);
  EXPECT_EQ(Subsampling(*traits), "4:2:0");
}

TEST(JpegTraits, RoutesEachKindOfJpeg) {
  EXPECT_EQ(Route(Header(0xC0, 8, {0x22, 0x11, 0x11})), DecodeRoute::kHardware);      // baseline 4:2:0
  EXPECT_EQ(Route(Header(0xC0, 8, {0x22, 0x11, 0x11}), false), DecodeRoute::kGpu);    // no engines
  EXPECT_EQ(Route(Header(0xC0, 8, {0x11})), DecodeRoute::kHardware);                  // grey
  EXPECT_EQ(Route(Header(0xC2, 8, {0x21, 0x11, 0x11})), DecodeRoute::kGpu);           // progressive 4:2:2
  EXPECT_EQ(Route(Header(0xC1, 12, {0x11, 0x11, 0x11})), DecodeRoute::kCpu);          // 12-bit
  EXPECT_EQ(Route(Header(0xC9, 8, {0x22, 0x11, 0x11})), DecodeRoute::kCpu);           // arithmetic
  EXPECT_EQ(Route(Header(0xC3, 8, {0x11, 0x11, 0x11})), DecodeRoute::kCpu);           // lossless
  EXPECT_EQ(Route(Header(0xC0, 8, {0x11, 0x11, 0x11, 0x11}, 2)), DecodeRoute::kCpu);  // YCCK
  EXPECT_EQ(Route(Header(0xC0, 8, {0x11, 0x11, 0x11, 0x11}, 0)), DecodeRoute::kCpu);  // CMYK
  EXPECT_EQ(Route(Header(0xC0, 8, {0x11, 0x11, 0x11}, 0)), DecodeRoute::kCpu);        // RGB, no transform
  EXPECT_EQ(Route(Header(0xC0, 8, {0x11, 0x11, 0x11}, 1)), DecodeRoute::kHardware);   // Adobe YCbCr
  EXPECT_EQ(Route(Header(0xC0, 8, {0x12, 0x21, 0x11})), DecodeRoute::kCpu);           // unusual sampling
  auto traits = ReadJpegTraits(Header(0xC0, 8, {0x22, 0x11, 0x11}));
  ASSERT_TRUE(traits.ok());
  EXPECT_EQ(PlanGpuDecode(*traits, {.hardware = true, .hardware_max_side = 256}).route, DecodeRoute::kGpu);
  EXPECT_EQ(PlanGpuDecode(*ReadJpegTraits(Header(0xC9, 8, {0x11})), {}).reason, "arithmetic coding");
}

TEST(JpegTraits, BadHeadersAreCorruption) {
  EXPECT_FALSE(ReadJpegTraits(Bytes("not a jpeg")).ok());
  auto good = Header(0xC0, 8, {0x22, 0x11, 0x11});
  const std::size_t frame_end = good.size() - 10;    // the scan header (10 bytes) follows the frame header
  for (std::size_t cut = 0; cut < frame_end; ++cut)  // truncated before the frame header ends
    EXPECT_FALSE(ReadJpegTraits(std::span(good).first(cut)).ok()) << cut;
  EXPECT_FALSE(ReadJpegTraits(Header(0xC0, 8, {0x05})).ok());  // sampling factor 0
  EXPECT_FALSE(ReadJpegTraits(Header(0xC0, 8, {})).ok());      // no components
}

}  // namespace
}  // namespace stoker::codec
