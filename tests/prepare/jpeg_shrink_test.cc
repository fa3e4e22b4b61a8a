#include "prepare/jpeg_shrink.h"

#include <turbojpeg.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/exif.h"
#include "codec/jpeg.h"
#include "pipeline/loader_test_util.h"

namespace stoker::prepare {
namespace {

std::vector<std::byte> Bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) out[i] = static_cast<std::byte>(s[i]);
  return out;
}

// `jpeg` with an EXIF block saying `orientation`, right after SOI.
std::string WithOrientation(const std::string& jpeg, int orientation) {
  std::string tiff("II\x2A\x00\x08\x00\x00\x00\x01\x00\x12\x01\x03\x00\x01\x00\x00\x00", 18);
  tiff += static_cast<char>(orientation);
  tiff += std::string("\x00\x00\x00\x00\x00\x00\x00", 7);
  const std::string app1 = std::string("Exif\0\0", 6) + tiff;
  std::string block = "\xFF\xE1";
  block += static_cast<char>((app1.size() + 2) >> 8);
  block += static_cast<char>((app1.size() + 2) & 0xFF);
  return jpeg.substr(0, 2) + block + app1 + jpeg.substr(2);
}

codec::ImageSize SizeOf(const std::vector<std::byte>& jpeg) {
  auto size = codec::JpegSize(jpeg);
  EXPECT_TRUE(size.ok());
  return size.ok() ? *size : codec::ImageSize{};
}

TEST(ShrunkSize, KeepsTheAspectAndTheLongestSideBecomesTheMaximum) {
  EXPECT_EQ(ShrunkSize(1000, 500, 512).width, 512);
  EXPECT_EQ(ShrunkSize(1000, 500, 512).height, 256);
  EXPECT_EQ(ShrunkSize(333, 1000, 100).width, 33);  // 33.3 rounds down
  EXPECT_EQ(ShrunkSize(5000, 1, 100).height, 1);    // never 0
  EXPECT_EQ(ShrunkSize(300, 200, 300).width, 300);  // at the maximum: unchanged
}

TEST(ShrinkJpeg, LeavesSmallImagesAloneAndShrinksLargeOnes) {
  const auto small = Bytes(MakeJpeg(120, 80, 1));
  auto kept = ShrinkJpeg(small, 120, 90);
  ASSERT_TRUE(kept.ok()) << kept.error().ToString();
  EXPECT_FALSE(kept->has_value());

  const auto large = Bytes(MakeJpeg(400, 300, 2));
  auto shrunk = ShrinkJpeg(large, 100, 90);
  ASSERT_TRUE(shrunk.ok() && shrunk->has_value());
  EXPECT_EQ(SizeOf(**shrunk).width, 100);
  EXPECT_EQ(SizeOf(**shrunk).height, 75);
  EXPECT_LT((*shrunk)->size(), large.size());
  auto again = ShrinkJpeg(large, 100, 90);
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ(**again, **shrunk) << "the same input gives the same bytes";
  auto lower = ShrinkJpeg(large, 100, 40);
  ASSERT_TRUE(lower.ok() && lower->has_value());
  EXPECT_LT((*lower)->size(), (*shrunk)->size());
}

// 400 x 200, blue, with a red block in the bottom-left corner.
std::string MarkedJpeg() {
  std::vector<std::uint8_t> rgb(std::size_t{400} * 200 * 3);
  for (int y = 0; y < 200; ++y)
    for (int x = 0; x < 400; ++x) {
      const bool red = x < 100 && y >= 150;
      std::uint8_t* p = rgb.data() + (static_cast<std::size_t>(y) * 400 + x) * 3;
      p[0] = red ? 250 : 20;
      p[1] = 20;
      p[2] = red ? 20 : 250;
    }
  auto jpeg = codec::EncodeJpegRgb(rgb.data(), 400, 200, 95);
  EXPECT_TRUE(jpeg.ok());
  return std::string(reinterpret_cast<const char*>(jpeg->data()), jpeg->size());
}

TEST(ShrinkJpeg, AppliesTheExifOrientationAndDropsIt) {
  // Stored 400 wide and 200 high; orientation 6 shows it turned clockwise: 200 wide, 400 high.
  const auto rotated = Bytes(WithOrientation(MarkedJpeg(), 6));
  ASSERT_EQ(codec::JpegExifOrientation(rotated), 6);
  auto shrunk = ShrinkJpeg(rotated, 100, 95);
  ASSERT_TRUE(shrunk.ok() && shrunk->has_value()) << (shrunk.ok() ? "kept" : shrunk.error().ToString());
  EXPECT_EQ(SizeOf(**shrunk).width, 50);
  EXPECT_EQ(SizeOf(**shrunk).height, 100);
  EXPECT_EQ(codec::JpegExifOrientation(**shrunk), 1) << "no EXIF left to turn it twice";

  // Turned clockwise, the stored bottom-left corner is the shown top-left.
  codec::DecodedRegion result;
  ASSERT_TRUE(codec::DecodeJpeg(**shrunk, {}, 1, result).ok());
  auto at = [&](int x, int y) { return result.pixels.data() + (static_cast<std::size_t>(y) * 50 + x) * 3; };
  EXPECT_GT(at(2, 2)[0], 200);
  EXPECT_LT(at(2, 2)[2], 60);
  EXPECT_LT(at(47, 2)[0], 60);  // top-right: blue
  EXPECT_LT(at(2, 97)[0], 60);  // bottom-left: blue
  EXPECT_GT(at(2, 97)[2], 200);

  // A small image keeps its bytes, EXIF and all.
  auto small = ShrinkJpeg(rotated, 400, 90);
  ASSERT_TRUE(small.ok());
  EXPECT_FALSE(small->has_value());
}

TEST(ShrinkJpeg, BadImagesAreErrors) {
  auto text = ShrinkJpeg(Bytes("not a jpeg at all"), 100, 90);
  EXPECT_FALSE(text.ok());
  auto jpeg = MakeJpeg(400, 300, 4);
  auto truncated = ShrinkJpeg(Bytes(jpeg.substr(0, jpeg.size() / 2)), 100, 90);
  EXPECT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.error().code(), StatusCode::kCorruption) << truncated.error().ToString();
  auto huge = ShrinkJpeg(Bytes(MakeJpeg(400, 300, 5)), 100, 90, /*max_pixels=*/400 * 299);
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.error().message().find("claims 400x300 pixels"), std::string::npos) << huge.error().ToString();
  EXPECT_FALSE(JpegShrinker::Create(0, 90).ok());
  EXPECT_FALSE(JpegShrinker::Create(100, 101).ok());
  auto shrinker = JpegShrinker::Create(100, 90);
  ASSERT_TRUE(shrinker.ok());
  std::vector<std::byte> label = Bytes("3");
  SeekableTable restarts;
  auto untouched = (*shrinker)->Rewrite({"s", "cls", FieldKind::kInt}, label, restarts);
  ASSERT_TRUE(untouched.ok());
  EXPECT_EQ(*untouched, pack_internal::Rewritten::kUnchanged);
}

}  // namespace
}  // namespace stoker::prepare
