#include "transform/follow_raster.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <gtest/gtest.h>

#include "core/half.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

template <typename T>
T ValueOf(const std::vector<std::byte>& bytes) {
  T v{};
  EXPECT_EQ(bytes.size(), sizeof(T));
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}

TEST(FollowRaster, AFillIsHeldExactlyByItsTypeOrRefused) {
  EXPECT_EQ(ValueOf<std::uint8_t>(*FillBytes(ElementType::kUInt8, 255)), 255);
  EXPECT_FALSE(FillBytes(ElementType::kUInt8, 256).ok());
  EXPECT_FALSE(FillBytes(ElementType::kUInt8, -1).ok());
  EXPECT_FALSE(FillBytes(ElementType::kUInt8, 0.5).ok());
  EXPECT_FALSE(FillBytes(ElementType::kUInt8, std::nan("")).ok());
  EXPECT_EQ(ValueOf<std::int8_t>(*FillBytes(ElementType::kInt8, -128)), -128);
  EXPECT_FALSE(FillBytes(ElementType::kInt8, -129).ok());
  EXPECT_EQ(ValueOf<std::uint16_t>(*FillBytes(ElementType::kUInt16, 65535)), 65535);
  EXPECT_FALSE(FillBytes(ElementType::kUInt16, 65536).ok());
  EXPECT_EQ(ValueOf<std::int32_t>(*FillBytes(ElementType::kInt32, -1)), -1);
  EXPECT_EQ(ValueOf<std::uint64_t>(*FillBytes(ElementType::kUInt64, std::ldexp(1.0, 63))), std::uint64_t{1} << 63);
  EXPECT_FALSE(FillBytes(ElementType::kUInt64, std::ldexp(1.0, 64)).ok());
  EXPECT_FALSE(FillBytes(ElementType::kInt64, std::ldexp(1.0, 63)).ok());
  EXPECT_EQ(ValueOf<std::int64_t>(*FillBytes(ElementType::kInt64, -std::ldexp(1.0, 63))),
            std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(ValueOf<std::uint8_t>(*FillBytes(ElementType::kBool, 1)), 1);
  EXPECT_FALSE(FillBytes(ElementType::kBool, 2).ok());
  EXPECT_EQ(ValueOf<std::uint16_t>(*FillBytes(ElementType::kFloat16, 1.0)), 0x3C00);
  EXPECT_TRUE(std::isnan(ValueOf<float>(*FillBytes(ElementType::kFloat32, std::nan("")))));
  EXPECT_EQ(ValueOf<double>(*FillBytes(ElementType::kFloat64, -2.25)), -2.25);
  const auto refused = FillBytes(ElementType::kUInt16, -1);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("uint16"), std::string::npos);
}

constexpr int kW = 30, kH = 20;

// A rotation before a crop box, scaled up, flipped: some pixels come from
// outside the image (the fill), the rest from one source pixel each.
// (Qualified: a unity build may hold a helper called Step.)
SampleGeometry RotatedCrop(const ::stoker::transform::Step& rotation, bool in_parts) {
  SampleGeometry g;
  g.valid = true;
  g.source = {kW, kH};
  const StepParams p{"RandomRotation", {{"angle", 23.0}}, {}};
  g.before.push_back({&rotation, p, {kW, kH}});
  g.crop = SampleGeometry::Crop::kBox;
  g.box = {2, 1, 28, 19};
  g.out = {40, 27};
  g.flip = true;
  if (in_parts) {
    const Rect crop{2, 1, 26, 18};
    g.regions = {InputRegion(rotation.WarpFor(p, {kW, kH})->matrix, {kW, kH}, crop), crop};
  }
  return g;
}

template <typename T>
HostTensor TensorOf(ElementType type, std::vector<std::int64_t> shape, const std::vector<T>& values) {
  HostTensor t;
  t.type = type;
  t.shape = std::move(shape);
  t.data.resize(values.size() * sizeof(T));
  std::memcpy(t.data.data(), values.data(), t.data.size());
  return t;
}

template <typename T>
std::vector<T> ValuesOf(const HostTensor& t) {
  std::vector<T> out(t.data.size() / sizeof(T));
  std::memcpy(out.data(), t.data.data(), t.data.size());
  return out;
}

TEST(FollowRaster, EveryValueComesFromTheSourcePixelTheMaskTookOrIsTheFill) {
  auto rotation = MakeStep(TransformStep{"RandomRotation", {{"degrees", {30}}}, {}, {}});
  ASSERT_TRUE(rotation.ok());
  for (const bool in_parts : {false, true}) {
    const SampleGeometry g = RotatedCrop(**rotation, in_parts);
    RasterScratch scratch;
    // The source pixel of every output pixel, -1 where it moved in from outside.
    std::vector<std::int32_t> index(kW * kH);
    for (int i = 0; i < kW * kH; ++i) index[i] = i;
    HostTensor where = TensorOf(ElementType::kInt32, {kH, kW}, index);
    ASSERT_TRUE(FollowRaster(g, "array", "HWC", -1, where, scratch).ok());
    ASSERT_EQ(where.shape, (std::vector<std::int64_t>{27, 40}));
    const auto from = ValuesOf<std::int32_t>(where);
    // An 8-bit mask of labels (the pixel index mod 251, fill 250) takes the same pixels.
    Image mask, mask_scratch;
    mask.Reset(kW, kH, 1);
    for (int i = 0; i < kW * kH; ++i) mask.pixels[i] = static_cast<std::uint8_t>(i % 250);
    ASSERT_TRUE(FollowMask(g, mask, mask_scratch, 250).ok());
    int filled = 0;
    for (std::size_t i = 0; i < from.size(); ++i) {
      filled += from[i] < 0;
      EXPECT_EQ(mask.pixels[i], from[i] < 0 ? 250 : from[i] % 250) << i;
    }
    EXPECT_GT(filled, 20);                                 // the rotation brought in pixels from outside
    EXPECT_LT(filled, static_cast<int>(from.size()) / 2);  // and kept most
    // Three float64 bands (HWC, fill NaN) and the same bands planar (CHW, uint16, fill 7).
    std::vector<double> hwc(kW * kH * 3);
    std::vector<std::uint16_t> chw(kW * kH * 3);
    for (int i = 0; i < kW * kH; ++i)
      for (int b = 0; b < 3; ++b) {
        hwc[i * 3 + b] = i * 3 + b + 0.25;
        chw[b * kW * kH + i] = static_cast<std::uint16_t>(i * 3 + b);
      }
    HostTensor bands = TensorOf(ElementType::kFloat64, {kH, kW, 3}, hwc);
    HostTensor planes = TensorOf(ElementType::kUInt16, {3, kH, kW}, chw);
    ASSERT_TRUE(FollowRaster(g, "array", "HWC", std::nan(""), bands, scratch).ok());
    ASSERT_TRUE(FollowRaster(g, "array", "CHW", 7, planes, scratch).ok());
    ASSERT_EQ(bands.shape, (std::vector<std::int64_t>{27, 40, 3}));
    ASSERT_EQ(planes.shape, (std::vector<std::int64_t>{3, 27, 40}));
    const auto moved = ValuesOf<double>(bands);
    const auto moved_planes = ValuesOf<std::uint16_t>(planes);
    const std::size_t plane = 27 * 40;
    for (std::size_t i = 0; i < from.size(); ++i)
      for (int b = 0; b < 3; ++b) {
        if (from[i] < 0) {
          EXPECT_TRUE(std::isnan(moved[i * 3 + b])) << i;
          EXPECT_EQ(moved_planes[b * plane + i], 7) << i;
        } else {
          EXPECT_EQ(moved[i * 3 + b], from[i] * 3 + b + 0.25) << i;
          EXPECT_EQ(moved_planes[b * plane + i], from[i] * 3 + b) << i;
        }
      }
  }
}

TEST(FollowRaster, ARasterOfAnotherSizeOrShapeOrAnUnholdableFillIsNamed) {
  auto rotation = MakeStep(TransformStep{"RandomRotation", {{"degrees", {30}}}, {}, {}});
  ASSERT_TRUE(rotation.ok());
  const SampleGeometry g = RotatedCrop(**rotation, false);
  RasterScratch scratch;
  HostTensor small = TensorOf(ElementType::kFloat32, {kH, kW - 1}, std::vector<float>(kH * (kW - 1)));
  Status s = FollowRaster(g, "array", "HWC", 0, small, scratch);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("the array is 29x20, its image 30x20"), std::string::npos) << s.message();
  HostTensor chw = TensorOf(ElementType::kFloat32, {kH, kW, 2}, std::vector<float>(kH * kW * 2));
  s = FollowRaster(g, "array", "CHW", 0, chw, scratch);  // read as 20 bands of 30 x 2
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  HostTensor four = TensorOf(ElementType::kUInt8, {1, 1, kH, kW}, std::vector<std::uint8_t>(kH * kW));
  s = FollowRaster(g, "array", "HWC", 0, four, scratch);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("[1, 1, 20, 30]"), std::string::npos) << s.message();
  HostTensor bytes = TensorOf(ElementType::kUInt8, {kH, kW}, std::vector<std::uint8_t>(kH * kW));
  s = FollowRaster(g, "array", "HWC", 300, bytes, scratch);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("uint8"), std::string::npos) << s.message();
  EXPECT_EQ(bytes.shape, (std::vector<std::int64_t>{kH, kW}));  // left as it was
}

}  // namespace
}  // namespace stoker::transform
