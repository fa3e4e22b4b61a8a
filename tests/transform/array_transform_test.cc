// Array transforms: crops land inside the array and copy exactly its
// window, in either layout and any element size; flips mirror; Normalize
// gives float32 per band; arrays of one size share the sample's draws;
// what is not taken is refused by name.
#include "transform/array_transform.h"

#include "transform/array_resize.h"

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::transform {
namespace {

// An array whose element at (y, x, c) (HWC) or (c, y, x) (CHW) is 1000 c +
// 10 y + x, as uint16.
HostTensor Numbered(int height, int width, int bands, bool chw) {
  HostTensor t;
  t.type = ElementType::kUInt16;
  t.shape = bands == 0 ? std::vector<std::int64_t>{height, width}
            : chw      ? std::vector<std::int64_t>{bands, height, width}
                       : std::vector<std::int64_t>{height, width, bands};
  const int b = bands == 0 ? 1 : bands;
  t.data.resize(static_cast<std::size_t>(height) * width * b * 2);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < b; ++c) {
        const auto v = static_cast<std::uint16_t>(1000 * c + 10 * y + x);
        const std::size_t i = chw ? (static_cast<std::size_t>(c) * height + y) * width + x
                                  : (static_cast<std::size_t>(y) * width + x) * b + c;
        std::memcpy(t.data.data() + 2 * i, &v, 2);
      }
  return t;
}

std::uint16_t At(const HostTensor& t, int y, int x, int c, bool chw) {
  const bool two_d = t.shape.size() == 2;
  const std::int64_t h = chw && !two_d ? t.shape[1] : t.shape[0];
  const std::int64_t w = chw && !two_d ? t.shape[2] : t.shape[1];
  const std::int64_t b = two_d ? 1 : (chw ? t.shape[0] : t.shape[2]);
  const std::size_t i =
      chw ? (static_cast<std::size_t>(c) * h + y) * w + x : (static_cast<std::size_t>(y) * w + x) * b + c;
  std::uint16_t v;
  std::memcpy(&v, t.data.data() + 2 * i, 2);
  return v;
}

TransformStep ArrayStep(std::string name, std::vector<std::pair<std::string, std::vector<double>>> args) {
  return TransformStep{std::move(name), std::move(args), {}, {}};
}

TEST(ArrayTransform, RandomCropsCopyAWindowInsideTheArrayInEitherLayout) {
  for (bool chw : {false, true}) {
    std::set<std::pair<int, int>> corners;
    for (std::uint64_t sample = 0; sample < 400; ++sample) {
      HostTensor t = Numbered(7, 9, 3, chw);
      Rng rng(1, sample);
      std::vector<std::byte> scratch;
      ASSERT_OK(
          ApplyArrayTransform({ArrayStep("RandomCrop", {{"size", {4, 5}}})}, chw ? "CHW" : "HWC", rng, t, scratch));
      ASSERT_EQ(t.shape, chw ? (std::vector<std::int64_t>{3, 4, 5}) : (std::vector<std::int64_t>{4, 5, 3}));
      ASSERT_EQ(t.data.size(), 4u * 5 * 3 * 2);
      const int top = At(t, 0, 0, 0, chw) / 10, left = At(t, 0, 0, 0, chw) % 10;
      ASSERT_LE(top, 3);
      ASSERT_LE(left, 4);
      corners.insert({top, left});
      for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 5; ++x)
          for (int c = 0; c < 3; ++c)
            ASSERT_EQ(At(t, y, x, c, chw), 1000 * c + 10 * (top + y) + left + x) << chw << " " << sample;
    }
    EXPECT_EQ(corners.size(), 4u * 5);  // every position is drawn
  }
}

TEST(ArrayTransform, CenterCropRoundsAsTorchvisionAndTwoDimensionalArraysWork) {
  for (const char* layout : {"HWC", "CHW"}) {
    HostTensor t = Numbered(7, 9, 0, false);
    Rng rng(0, 0);
    std::vector<std::byte> scratch;
    ASSERT_OK(ApplyArrayTransform({ArrayStep("CenterCrop", {{"size", {4}}})}, layout, rng, t, scratch));
    EXPECT_EQ(t.shape, (std::vector<std::int64_t>{4, 4}));
    EXPECT_EQ(At(t, 0, 0, 0, false), 10 * 2 + 2);  // round(1.5) = 2, round(2.5) = 2: half to even
  }
}

TEST(ArrayTransform, FlipsMirrorAndNormalizeGivesFloat32ABand) {
  for (bool chw : {false, true}) {
    HostTensor t = Numbered(3, 4, 2, chw);
    Rng rng(0, 0);
    std::vector<std::byte> scratch;
    ASSERT_OK(ApplyArrayTransform(
        {ArrayStep("RandomHorizontalFlip", {{"p", {1}}}), ArrayStep("RandomVerticalFlip", {{"p", {1}}}),
         ArrayStep("RandomHorizontalFlip", {{"p", {0}}})},
        chw ? "CHW" : "HWC", rng, t, scratch));
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x)
        for (int c = 0; c < 2; ++c) ASSERT_EQ(At(t, y, x, c, chw), 1000 * c + 10 * (2 - y) + (3 - x));
    ASSERT_OK(ApplyArrayTransform({ArrayStep("Normalize", {{"mean", {10, 1010}}, {"std", {2, 4}}})},
                                  chw ? "CHW" : "HWC", rng, t, scratch));
    ASSERT_EQ(t.type, ElementType::kFloat32);
    ASSERT_EQ(t.data.size(), 3u * 4 * 2 * 4);
    // (y, x, c) = (0, 0, 1) holds 1000 + 23 before: (1023 - 1010) / 4.
    const std::size_t i = chw ? 12 : 1;
    float v;
    std::memcpy(&v, t.data.data() + 4 * i, 4);
    EXPECT_FLOAT_EQ(v, 13.0f / 4);
  }
  HostTensor half;  // float16 in: 1.5, -2 -> (x - 1) / 0.5
  half.type = ElementType::kFloat16;
  half.shape = {1, 2};
  const std::uint16_t bits[] = {0x3E00, 0xC000};
  half.data.resize(4);
  std::memcpy(half.data.data(), bits, 4);
  Rng rng(0, 0);
  std::vector<std::byte> scratch;
  ASSERT_OK(ApplyArrayTransform({ArrayStep("Normalize", {{"mean", {1}}, {"std", {0.5}}})}, "HWC", rng, half, scratch));
  float out[2];
  std::memcpy(out, half.data.data(), 8);
  EXPECT_FLOAT_EQ(out[0], 1.0f);
  EXPECT_FLOAT_EQ(out[1], -6.0f);
}

TEST(ArrayTransform, ArraysOfOneSizeGivenTheSameStepsShareTheSamplesDraws) {
  const std::vector<TransformStep> steps = {ArrayStep("RandomCrop", {{"size", {5, 5}}}),
                                            ArrayStep("RandomHorizontalFlip", {{"p", {0.5}}})};
  int differ = 0;
  for (std::uint64_t sample = 0; sample < 50; ++sample) {
    HostTensor bands = Numbered(12, 12, 4, false), labels = Numbered(12, 12, 0, false);
    std::vector<std::byte> scratch;
    Rng a(7, sample), b(7, sample), other(7, sample + 1000);
    ASSERT_OK(ApplyArrayTransform(steps, "HWC", a, bands, scratch));
    ASSERT_OK(ApplyArrayTransform(steps, "HWC", b, labels, scratch));
    HostTensor elsewhere = Numbered(12, 12, 0, false);
    ASSERT_OK(ApplyArrayTransform(steps, "HWC", other, elsewhere, scratch));
    for (int y = 0; y < 5; ++y)
      for (int x = 0; x < 5; ++x) ASSERT_EQ(At(bands, y, x, 0, false), At(labels, y, x, 0, false));
    differ += elsewhere.data != labels.data;
  }
  EXPECT_GT(differ, 40);  // other samples draw other crops
}

TEST(ArrayTransform, WhatIsNotTakenIsRefusedByName) {
  const std::pair<std::vector<TransformStep>, std::string> cases[] = {
      {{ArrayStep("RandomRotation", {{"degrees", {10}}})}, "not RandomRotation"},
      {{ArrayStep("RandomCrop", {{"size", {4}}, {"padding", {2}}})}, "padding is not taken"},
      {{ArrayStep("RandomCrop", {{"size", {0}}})}, "size 0 is no positive integer"},
      {{ArrayStep("RandomHorizontalFlip", {{"p", {1.5}}})}, "p = 1.5 is not in [0, 1]"},
      {{ArrayStep("Normalize", {{"mean", {1}}, {"std", {0}}})}, "std 0 is not positive"},
      {{ArrayStep("CenterCrop", {{"size", {4}}, {"fill", {1}}})}, "argument 'fill' is not taken"},
  };
  for (const auto& [steps, says] : cases) {
    Status s = CheckArrayTransform(steps, "HWC");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(says), std::string::npos) << s.message();
  }
  EXPECT_NE(CheckArrayTransform({}, "WHC").message().find("\"HWC\" or \"CHW\""), std::string::npos);

  Rng rng(0, 0);
  std::vector<std::byte> scratch;
  HostTensor small = Numbered(3, 4, 2, false);
  Status s = ApplyArrayTransform({ArrayStep("RandomCrop", {{"size", {4, 4}}})}, "HWC", rng, small, scratch);
  EXPECT_NE(s.message().find("RandomCrop of 4x4 from an array of 3x4"), std::string::npos) << s.message();
  HostTensor bands = Numbered(3, 4, 2, false);
  s = ApplyArrayTransform({ArrayStep("Normalize", {{"mean", {1, 2, 3}}, {"std", {1}}})}, "HWC", rng, bands, scratch);
  EXPECT_NE(s.message().find("3 means and 1 stds for an array of 2 bands"), std::string::npos) << s.message();
  HostTensor four_d;
  four_d.shape = {1, 2, 2, 1};
  four_d.data.resize(4);
  s = ApplyArrayTransform({ArrayStep("RandomVerticalFlip", {})}, "HWC", rng, four_d, scratch);
  EXPECT_NE(s.message().find("not shape [1, 2, 2, 1]"), std::string::npos) << s.message();
}

TEST(ArrayTransform, ResizeNearestPicksTorchsSourcesAndBilinearFiltersAsTorchAntialiased) {
  Rng rng(0, 0);
  std::vector<std::byte> scratch;
  for (bool chw : {false, true}) {
    HostTensor t = Numbered(4, 6, 2, chw);
    TransformStep nearest = ArrayStep("Resize", {{"size", {3, 4}}});
    nearest.words = {{"interpolation", "nearest"}};
    ASSERT_OK(ApplyArrayTransform({nearest}, chw ? "CHW" : "HWC", rng, t, scratch));
    // torch: source floor(i * in / out): rows 0, 1, 2 of 4; columns 0, 1, 3, 4 of 6.
    const int rows[] = {0, 1, 2}, cols[] = {0, 1, 3, 4};
    for (int y = 0; y < 3; ++y)
      for (int x = 0; x < 4; ++x)
        for (int c = 0; c < 2; ++c) EXPECT_EQ(At(t, y, x, c, chw), 1000 * c + 10 * rows[y] + cols[x]) << chw;
  }
  // Upsampling [1, 2] to 4 values: 1, 1.25, 1.75, 2 (bilinear, the edges held).
  HostTensor row;
  row.type = ElementType::kFloat32;
  row.shape = {1, 2};
  const float two[] = {1, 2};
  row.data.resize(sizeof two);
  std::memcpy(row.data.data(), two, sizeof two);
  ASSERT_OK(ApplyArrayTransform({ArrayStep("Resize", {{"size", {1, 4}}})}, "HWC", rng, row, scratch));
  ASSERT_EQ(row.shape, (std::vector<std::int64_t>{1, 4}));
  float four[4];
  std::memcpy(four, row.data.data(), sizeof four);
  EXPECT_FLOAT_EQ(four[0], 1);
  EXPECT_FLOAT_EQ(four[1], 1.25f);
  EXPECT_FLOAT_EQ(four[2], 1.75f);
  EXPECT_FLOAT_EQ(four[3], 2);
  // Downsampling by 2 averages under a triangle twice as wide: [0, 1, 2, 3] -> [5/7, 16/7] in uint8, rounded.
  HostTensor bytes;
  bytes.type = ElementType::kUInt8;
  bytes.shape = {1, 4};
  bytes.data = {std::byte{0}, std::byte{70}, std::byte{140}, std::byte{210}};
  ASSERT_OK(ApplyArrayTransform({ArrayStep("Resize", {{"size", {1, 2}}})}, "HWC", rng, bytes, scratch));
  ASSERT_EQ(bytes.data.size(), 2u);
  EXPECT_EQ(static_cast<int>(bytes.data[0]), 50);   // (0 * 3 + 70 * 3 + 140 * 1) / 7
  EXPECT_EQ(static_cast<int>(bytes.data[1]), 160);  // (70 * 1 + 140 * 3 + 210 * 3) / 7
  // One size: the shorter side, the longer as int(size * long / short).
  EXPECT_EQ(ArrayResizeSize({10}, 30, 45), (std::pair<std::int64_t, std::int64_t>{10, 15}));
  EXPECT_EQ(ArrayResizeSize({10}, 45, 31), (std::pair<std::int64_t, std::int64_t>{14, 10}));
  // Bilinear of bools and other interpolations are refused by name.
  HostTensor flags;
  flags.type = ElementType::kBool;
  flags.shape = {2, 2};
  flags.data.resize(4);
  EXPECT_NE(
      ApplyArrayTransform({ArrayStep("Resize", {{"size", {1}}})}, "HWC", rng, flags, scratch).message().find("bool"),
      std::string::npos);
  HostTensor wide = Numbered(2, 3, 0, false);  // a 2:3 array's shorter side to 1e5: 1e5 x 1.5e5 pixels
  EXPECT_NE(ApplyArrayTransform({ArrayStep("Resize", {{"size", {100000}}})}, "HWC", rng, wide, scratch)
                .message()
                .find("at most"),
            std::string::npos);
  TransformStep bicubic = ArrayStep("Resize", {{"size", {4}}});
  bicubic.words = {{"interpolation", "bicubic"}};
  EXPECT_NE(CheckArrayTransform({bicubic}, "HWC").message().find("'bicubic' is not taken"), std::string::npos);
}

}  // namespace
}  // namespace stoker::transform
