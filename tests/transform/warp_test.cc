#include "transform/warp.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include <gtest/gtest.h>

#include "core/rng.h"
#include "transform/color.h"
#include "transform/color_pixel.h"

namespace stoker::transform {
namespace {

Image Gradient(int w, int h, int c = 3) {
  Image im;
  im.Reset(w, h, c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int b = 0; b < c; ++b) im.row(y)[x * c + b] = static_cast<std::uint8_t>((x * 7 + y * 13 + b * 50) % 256);
  return im;
}

TEST(Warp, TransposesMoveEveryPixelWhereItBelongs) {
  const Image in = Gradient(5, 3);
  Image out;
  TransposeImage(in, Transpose::kRotate90, out);  // counter-clockwise
  ASSERT_EQ(out.width, 3);
  ASSERT_EQ(out.height, 5);
  // Input (x, y) lands at (y, W - 1 - x).
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 5; ++x) EXPECT_EQ(out.row(4 - x)[y * 3], in.row(y)[x * 3]);
  Image back, twice;
  TransposeImage(out, Transpose::kRotate270, back);
  EXPECT_EQ(back.pixels, in.pixels);
  TransposeImage(in, Transpose::kRotate180, out);
  TransposeImage(out, Transpose::kRotate180, twice);
  EXPECT_EQ(twice.pixels, in.pixels);
  TransposeImage(in, Transpose::kFlipTopBottom, out);
  EXPECT_EQ(out.row(0)[0], in.row(2)[0]);
}

TEST(Warp, RotationByZeroAndAFullTurnKeepsTheImage) {
  const Image in = Gradient(31, 17);
  Image out;
  for (double angle : {0.0, 360.0, -360.0, 720.0}) {
    RotateImage(in, angle, Interpolation::kBilinear, false, std::nullopt, {0, 0, 0}, out);
    EXPECT_EQ(out.pixels, in.pixels) << angle;
  }
}

TEST(Warp, ExpandGrowsTheCanvasToHoldTheRotatedImage) {
  const RotationPlan plan = PlanRotation({100, 50}, 90.0, true, std::nullopt);
  EXPECT_EQ(plan.size.width, 50);
  EXPECT_EQ(plan.size.height, 100);
  const RotationPlan diagonal = PlanRotation({100, 100}, 45.0, true, std::nullopt);
  EXPECT_EQ(diagonal.size.width, 142);  // ceil/floor of the rotated corners, as Pillow
  EXPECT_EQ(PlanRotation({100, 100}, 45.0, false, std::nullopt).size.width, 100);
}

TEST(Warp, PixelsOutsideTheSourceTakeTheFill) {
  const Image in = Gradient(20, 20);
  Image out;
  // Shift right by 5: the first five columns come from outside.
  const AffineMatrix shift{1, 0, -5, 0, 1, 0};
  for (auto interpolation : {Interpolation::kNearest, Interpolation::kBilinear}) {
    WarpAffine(in, shift, interpolation, {9, 8, 7}, {20, 20}, out);
    EXPECT_EQ(out.row(3)[0], 9);
    EXPECT_EQ(out.row(3)[4 * 3 + 2], 7);
    EXPECT_EQ(out.row(3)[5 * 3], in.row(3)[0]);
  }
}

TEST(Warp, NearestEnginesAgreeOnAnIntegerRotation) {
  // 90 degrees through the fixed-point engine (centre given, so no fast
  // path) matches the exact transpose.
  const Image in = Gradient(16, 16);
  Image fast, general;
  RotateImage(in, 90.0, Interpolation::kNearest, false, std::nullopt, {0, 0, 0}, fast);
  RotateImage(in, 90.0, Interpolation::kNearest, false, std::array<double, 2>{8.0, 8.0}, {0, 0, 0}, general);
  EXPECT_EQ(fast.pixels, general.pixels);
}

TEST(Warp, InverseAffineOfTheIdentityIsTheIdentity) {
  const AffineMatrix m = InverseAffineMatrix({10, 20}, 0, {0, 0}, 1, {0, 0});
  for (int i : {0, 4}) EXPECT_NEAR(m[static_cast<std::size_t>(i)], 1.0, 1e-12);
  for (int i : {1, 2, 3, 5}) EXPECT_NEAR(m[static_cast<std::size_t>(i)], 0.0, 1e-12);
  const AffineMatrix r = InverseAffineMatrix({0, 0}, 30, {3, -4}, 1.5, {10, 5});
  const auto inverse = InvertAffine(r);
  ASSERT_TRUE(inverse.has_value());
  const auto there = MapPoint(*inverse, 7, 11);
  const auto back = MapPoint(r, there[0], there[1]);
  EXPECT_NEAR(back[0], 7, 1e-9);
  EXPECT_NEAR(back[1], 11, 1e-9);
  EXPECT_FALSE(InvertAffine({0, 0, 1, 0, 0, 1}).has_value());
}

TEST(Warp, RoundDecimalIsPythonsRound) {
  EXPECT_EQ(RoundDecimal(0.1234567890123456789, 15), 0.123456789012346);
  EXPECT_EQ(RoundDecimal(-1.0, 15), -1.0);
  EXPECT_EQ(RoundDecimal(6.123233995736766e-17, 15), 0.0);  // cos(90 degrees) becomes exactly 0
}

TEST(Color, BlendsFollowPillow) {
  Image im = Gradient(8, 8);
  const Image original = im;
  AdjustBrightness(im, 1.0);
  EXPECT_EQ(im.pixels, original.pixels);
  AdjustBrightness(im, 0.0);
  for (auto v : im.pixels) EXPECT_EQ(v, 0);
  im = original;
  AdjustBrightness(im, 2.0);  // extrapolation clips
  for (std::size_t i = 0; i < im.pixels.size(); ++i) EXPECT_EQ(im.pixels[i], std::min(255, original.pixels[i] * 2));
  im = original;
  AdjustSaturation(im, 0.0);  // all gray
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(im.pixels[static_cast<std::size_t>(i) * 3], im.pixels[static_cast<std::size_t>(i) * 3 + 1]);
    EXPECT_EQ(im.pixels[static_cast<std::size_t>(i) * 3], Luma(&original.pixels[static_cast<std::size_t>(i) * 3]));
  }
}

TEST(Color, HueShiftLeavesGrayAlone) {
  Image gray;
  gray.Reset(4, 4, 3);
  std::fill(gray.pixels.begin(), gray.pixels.end(), 120);
  AdjustHue(gray, 0.3);
  for (auto v : gray.pixels) EXPECT_EQ(v, 120);
}

// AdjustHue takes its divisions from tables (color.cc's HueTables): every
// one of the 16.7M colours must come out as Pillow's arithmetic, written
// out per pixel in ShiftHue, gives it.
TEST(Color, HueTablesGiveTheArithmeticsResultForEveryColour) {
  Image all;
  all.Reset(4096, 4096, 3);
  for (std::uint32_t i = 0; i < 4096u * 4096u; ++i) {
    all.pixels[3 * std::size_t{i}] = static_cast<std::uint8_t>(i >> 16);
    all.pixels[3 * std::size_t{i} + 1] = static_cast<std::uint8_t>(i >> 8);
    all.pixels[3 * std::size_t{i} + 2] = static_cast<std::uint8_t>(i);
  }
  for (const double factor : {0.0, -0.37}) {
    Image tabled = all;
    AdjustHue(tabled, factor);
    const auto shift = static_cast<std::uint8_t>(static_cast<int>(factor * 255));
    std::size_t differ = 0;
    for (std::uint32_t i = 0; i < 4096u * 4096u; ++i) {
      std::uint8_t expected[3] = {all.pixels[3 * std::size_t{i}], all.pixels[3 * std::size_t{i} + 1],
                                  all.pixels[3 * std::size_t{i} + 2]};
      ShiftHue(expected, shift);
      if (std::memcmp(expected, &tabled.pixels[3 * std::size_t{i}], 3) != 0 && differ++ < 5)
        ADD_FAILURE() << "factor " << factor << ": colour " << std::hex << i << " gives "
                      << int{tabled.pixels[3 * std::size_t{i}]} << "," << int{tabled.pixels[3 * std::size_t{i} + 1]}
                      << "," << int{tabled.pixels[3 * std::size_t{i} + 2]} << " where the arithmetic gives "
                      << int{expected[0]} << "," << int{expected[1]} << "," << int{expected[2]};
    }
    EXPECT_EQ(differ, 0u) << "factor " << factor;
  }
}

TEST(Color, LookupTableOperations) {
  Image im = Gradient(16, 16);
  const Image original = im;
  Invert(im);
  for (std::size_t i = 0; i < im.pixels.size(); ++i) EXPECT_EQ(im.pixels[i], 255 - original.pixels[i]);
  im = original;
  Posterize(im, 2);
  for (auto v : im.pixels) EXPECT_EQ(v & 0x3f, 0);
  im = original;
  Solarize(im, 128);
  for (std::size_t i = 0; i < im.pixels.size(); ++i)
    EXPECT_EQ(im.pixels[i], original.pixels[i] < 128 ? original.pixels[i] : 255 - original.pixels[i]);
  Image flat;
  flat.Reset(3, 3, 3);
  std::fill(flat.pixels.begin(), flat.pixels.end(), 77);
  Image copy = flat;
  AutoContrast(copy);  // one value: unchanged
  Equalize(copy);
  EXPECT_EQ(copy.pixels, flat.pixels);
}

}  // namespace
}  // namespace stoker::transform

namespace stoker::transform {
namespace {

// A part of an image (rows y..y+h, columns x..x+w).
Image Part(const Image& in, Rect r) {
  Image out;
  out.Reset(r.width, r.height, in.channels);
  for (int y = 0; y < r.height; ++y)
    std::memcpy(out.row(y), in.row(r.y + y) + static_cast<std::size_t>(r.x) * in.channels,
                static_cast<std::size_t>(r.width) * in.channels);
  return out;
}

// Pillow's bilinear_filter8 for one output pixel, written out plainly per
// channel: the engine computes 3-channel pixels with their channels in
// vector lanes (and falls back per channel at the buffer's last pixel).
std::array<std::uint8_t, 4> BilinearReference(const Image& in, const AffineMatrix& a, int x, int y,
                                              const std::array<std::uint8_t, 4>& fill) {
  const int W = in.width, H = in.height;
  double xin = a[0] * (x + 0.5) + a[1] * (y + 0.5) + a[2];
  double yin = a[3] * (x + 0.5) + a[4] * (y + 0.5) + a[5];
  if (!(xin >= 0.0 && xin < W && yin >= 0.0 && yin < H)) return fill;
  xin -= 0.5;
  yin -= 0.5;
  const int xi = static_cast<int>(std::floor(xin)), yi = static_cast<int>(std::floor(yin));
  const double dx = xin - xi, dy = yin - yi;
  const int x0 = std::clamp(xi, 0, W - 1), x1 = std::clamp(xi + 1, 0, W - 1);
  const int y0 = std::clamp(yi, 0, H - 1);
  const bool has_next = yi + 1 >= 0 && yi + 1 < H;
  std::array<std::uint8_t, 4> out{};
  for (int b = 0; b < in.channels; ++b) {
    auto at = [&](int px, int py) { return static_cast<int>(in.row(py)[px * in.channels + b]); };
    double v1 = at(x0, y0) + (at(x1, y0) - at(x0, y0)) * dx;
    double v2 = v1;
    if (has_next) v2 = at(x0, yi + 1) + (at(x1, yi + 1) - at(x0, yi + 1)) * dx;
    v1 = v1 + (v2 - v1) * dy;
    out[static_cast<std::size_t>(b)] = static_cast<std::uint8_t>(v1);
  }
  return out;
}

TEST(Warp, TheBilinearEngineIsPillowsFilterPixelForPixel) {
  Rng rng(11, 3);
  for (const int channels : {3, 1}) {
    for (int trial = 0; trial < 40; ++trial) {
      Image in;
      in.Reset(20 + static_cast<int>(rng.Below(40)), 15 + static_cast<int>(rng.Below(30)), channels);
      for (auto& v : in.pixels) v = static_cast<std::uint8_t>(rng.Below(256));
      // Rotations, scales and shears that reach every edge and corner (the
      // buffer's last pixel included), some far outside.
      const AffineMatrix m = InverseAffineMatrix({in.width / 2.0, in.height / 2.0}, rng.Uniform(-60, 60),
                                                 {rng.Uniform(-4, 4), rng.Uniform(-4, 4)}, rng.Uniform(0.5, 1.6),
                                                 {rng.Uniform(-20, 20), rng.Uniform(-20, 20)});
      const Size out_size{in.width + 6, in.height + 4};
      Image out;
      WarpAffine(in, m, Interpolation::kBilinear, {9, 8, 7}, out_size, out);
      const std::array<std::uint8_t, 4> fill{9, 8, 7, 0};
      for (int y = 0; y < out_size.height; ++y)
        for (int x = 0; x < out_size.width; ++x) {
          const auto expected = BilinearReference(in, m, x, y, fill);
          for (int b = 0; b < channels; ++b)
            ASSERT_EQ(out.row(y)[x * channels + b], expected[static_cast<std::size_t>(b)])
                << "channels " << channels << " trial " << trial << " at " << x << "," << y << " channel " << b;
        }
    }
  }
}

// Pillow's affine_fixed for one output pixel, written out plainly: the
// position computed for this pixel alone in 64-bit ints (the engine adds the
// steps along the row, 8 lanes at a time where it can).
std::array<std::uint8_t, 4> FixedReference(const Image& in, const AffineMatrix& a, int x, int y,
                                           const std::array<std::uint8_t, 4>& fill) {
  auto fix = [](double v) { return static_cast<std::int64_t>(std::floor(v * 65536.0 + 0.5)); };
  const std::int64_t xx = fix(a[2] + a[0] * 0.5 + a[1] * 0.5) + fix(a[1]) * y + fix(a[0]) * x;
  const std::int64_t yy = fix(a[5] + a[3] * 0.5 + a[4] * 0.5) + fix(a[4]) * y + fix(a[3]) * x;
  const std::int64_t xi = xx >> 16, yi = yy >> 16;
  if (xi < 0 || xi >= in.width || yi < 0 || yi >= in.height) return fill;
  std::array<std::uint8_t, 4> out{};
  for (int b = 0; b < in.channels; ++b)
    out[static_cast<std::size_t>(b)] = in.row(static_cast<int>(yi))[xi * in.channels + b];
  return out;
}

TEST(Warp, TheFixedPointEngineIsPillowsAffineFixedPixelForPixel) {
  Rng rng(5, 9);
  for (const int channels : {3, 1, 4}) {
    for (int trial = 0; trial < 60; ++trial) {
      Image in;
      in.Reset(9 + static_cast<int>(rng.Below(70)), 9 + static_cast<int>(rng.Below(50)), channels);
      for (auto& v : in.pixels) v = static_cast<std::uint8_t>(rng.Below(256));
      // Rotations (either way, past 90 degrees: both coordinates moving
      // either way along a row), shears and scales, some shifted far enough
      // that whole rows fall outside: all in the fixed-point engine's range.
      const AffineMatrix m = InverseAffineMatrix({in.width / 2.0, in.height / 2.0}, rng.Uniform(-170, 170),
                                                 {rng.Uniform(-8, 8), rng.Uniform(-8, 8)}, rng.Uniform(0.4, 2.5),
                                                 {rng.Uniform(-25, 25), rng.Uniform(-25, 25)});
      ASSERT_TRUE(m[1] != 0 || m[3] != 0);
      const Size out_size{in.width + static_cast<int>(rng.Below(9)), in.height + static_cast<int>(rng.Below(9))};
      const std::array<std::uint8_t, 4> fill{9, 8, 7, 0};
      Image whole;
      WarpAffine(in, m, Interpolation::kNearest, {9, 8, 7}, out_size, whole);
      for (int y = 0; y < out_size.height; ++y)
        for (int x = 0; x < out_size.width; ++x) {
          const auto expected = FixedReference(in, m, x, y, fill);
          for (int b = 0; b < channels; ++b)
            ASSERT_EQ(whole.row(y)[x * channels + b], expected[static_cast<std::size_t>(b)])
                << "channels " << channels << " trial " << trial << " at " << x << "," << y << " channel " << b;
        }
      // A region drawn from just the pixels it reads: the part's buffer ends
      // where the region's reads do (its last pixel read as the last 4 bytes).
      const int w = 1 + static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.width)));
      const int h = 1 + static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.height)));
      const Rect rect{static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.width - w + 1))),
                      static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.height - h + 1))), w, h};
      const Rect needed = InputRegion(m, in.size(), rect);
      const Image source = needed.width > 0 ? Part(in, needed) : Image{0, 0, channels, {}};
      Image part;
      WarpAffineRegion(source, needed.x, needed.y, in.size(), m, Interpolation::kNearest, {9, 8, 7}, out_size, rect,
                       part);
      ASSERT_EQ(part.pixels, Part(whole, rect).pixels) << "channels " << channels << " trial " << trial;
    }
  }
}

TEST(Warp, ARegionFromThePixelsItReadsIsThatPartOfTheWholeWarp) {
  const Image in = Gradient(97, 61);
  Rng rng(7, 7);
  int regions = 0;
  for (int trial = 0; trial < 300; ++trial) {
    AffineMatrix m;
    const int kind = trial % 4;
    if (kind == 0) {  // rotation (fixed point, nearest)
      m = PlanRotation(in.size(), rng.Uniform(-40, 40), trial % 8 == 0, std::nullopt).matrix;
    } else if (kind == 1) {  // scale and shift only (Pillow's scale engine)
      m = {rng.Uniform(0.5, 2), 0, rng.Uniform(-20, 20), 0, rng.Uniform(0.5, 2), rng.Uniform(-20, 20)};
    } else if (kind == 2) {  // huge offsets: the floating-point engine
      m = {1, 0.01, 40000, -0.01, 1, 0};
    } else {
      m = InverseAffineMatrix({48, 30}, rng.Uniform(-30, 30), {3, -2}, rng.Uniform(0.7, 1.3), {5, -3});
    }
    const Size out_size{97 + trial % 13, 61 + trial % 7};
    for (auto interpolation : {Interpolation::kNearest, Interpolation::kBilinear}) {
      Image whole, part;
      WarpAffine(in, m, interpolation, {1, 2, 3}, out_size, whole);
      const int w = 1 + static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.width)));
      const int h = 1 + static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.height)));
      const Rect rect{static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.width - w + 1))),
                      static_cast<int>(rng.Below(static_cast<std::uint64_t>(out_size.height - h + 1))), w, h};
      const Rect needed = InputRegion(m, in.size(), rect);
      const Image source = needed.width > 0 ? Part(in, needed) : Image{};
      WarpAffineRegion(source, needed.x, needed.y, in.size(), m, interpolation, {1, 2, 3}, out_size, rect, part);
      ASSERT_EQ(part.pixels, Part(whole, rect).pixels) << "trial " << trial << " kind " << kind;
      regions += needed.width > 0;
    }
  }
  EXPECT_GT(regions, 300);
}

}  // namespace
}  // namespace stoker::transform
