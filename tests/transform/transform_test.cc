#include "transform/transform.h"
#include "core/half.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "stoker/pillow.h"
#include "transform/cpu_features.h"
#include "transform/resample.h"

namespace stoker::transform {
namespace {

TEST(RandomResizedCrop, BoxesAreInsideAndFollowTheRanges) {
  Rng rng(1, 2);
  for (int i = 0; i < 2000; ++i) {
    Box b = RandomResizedCropBox(500, 375, 0.08, 1.0, 3.0 / 4.0, 4.0 / 3.0, rng);
    ASSERT_GT(b.width, 0);
    ASSERT_GT(b.height, 0);
    ASSERT_GE(b.x, 0);
    ASSERT_GE(b.y, 0);
    ASSERT_LE(b.x + b.width, 500);
    ASSERT_LE(b.y + b.height, 375);
    const double area = static_cast<double>(b.width) * b.height / (500.0 * 375.0);
    EXPECT_GE(area, 0.07);
  }
}

TEST(RandomResizedCrop, FallsBackToTheCentralCrop) {
  Rng rng(0, 0);
  // A scale range no try can satisfy inside a very wide image: the central fallback.
  Box b = RandomResizedCropBox(1000, 10, 0.99, 1.0, 1.0, 1.0, rng);
  EXPECT_EQ(b.height, 10);
  EXPECT_EQ(b.width, 10);
  EXPECT_EQ(b.x, 495);
  EXPECT_EQ(b.y, 0);
}

TEST(ResizeCenterCrop, MatchesTorchvisionArithmetic) {
  // 500x375 -> Resize(256) gives 341x256; CenterCrop(224) at left round(58.5)=58 (half to even), top 16.
  FloatBox b = ResizeCenterCropBox(500, 375, 256, 224, 224);
  const double s = 375.0 / 256.0;
  EXPECT_NEAR(b.x0, 58 * (500.0 / 341.0), 1e-9);
  EXPECT_NEAR(b.y0, 16 * s, 1e-9);
  EXPECT_NEAR(b.y1 - b.y0, 224 * s, 1e-9);
}

// Pillow's Resample.c, written plainly (double weights, 22-bit fixed point,
// one pass then the other, uint8 between): what every SIMD path must
// reproduce exactly. Pillow <= 12 runs the horizontal pass first; Pillow 13
// the vertical one when the height shrinks by more than twice as many
// pixels as the width.
std::vector<std::uint8_t> PillowBilinear(const std::vector<std::uint8_t>& src, int w, int h, double x0, double y0,
                                         double x1, double y1, int ow, int oh, bool vertical_first = false) {
  constexpr int kBits = 22;
  auto coeffs = [&](int in_size, double in0, double in1, int out_size, std::vector<int>& lo, std::vector<int>& n,
                    std::vector<std::vector<std::int32_t>>& k) {
    const double scale = (in1 - in0) / out_size, fs = std::max(scale, 1.0), support = fs;
    lo.resize(out_size);
    n.resize(out_size);
    k.assign(out_size, {});
    for (int o = 0; o < out_size; ++o) {
      const double center = in0 + (o + 0.5) * scale;
      int a = std::max(0, static_cast<int>(center - support + 0.5));
      int b = std::min(in_size, static_cast<int>(center + support + 0.5));
      std::vector<double> ws;
      double sum = 0;
      for (int x = a; x < b; ++x) {
        const double t = std::fabs((x - center + 0.5) / fs);
        ws.push_back(t < 1 ? 1 - t : 0);
        sum += ws.back();
      }
      for (double wt : ws) {
        const double f = (sum != 0 ? wt / sum : 0) * (1 << kBits);
        k[o].push_back(static_cast<std::int32_t>(f < 0 ? std::trunc(f - 0.5) : std::trunc(f + 0.5)));
      }
      lo[o] = a;
      n[o] = b - a;
    }
  };
  std::vector<int> hlo, hn, vlo, vn;
  std::vector<std::vector<std::int32_t>> hk, vk;
  coeffs(w, x0, x1, ow, hlo, hn, hk);
  coeffs(h, y0, y1, oh, vlo, vn, vk);
  auto clamp8 = [](std::int64_t v) { return static_cast<std::uint8_t>(std::clamp<std::int64_t>(v >> kBits, 0, 255)); };
  // in (iw x ih) -> out (ow x ih)
  auto horizontal = [&](const std::vector<std::uint8_t>& in, int iw, int ih) {
    std::vector<std::uint8_t> out(static_cast<std::size_t>(ih) * ow * 3);
    for (int y = 0; y < ih; ++y)
      for (int o = 0; o < ow; ++o)
        for (int c = 0; c < 3; ++c) {
          std::int64_t acc = 1 << (kBits - 1);
          for (int t = 0; t < hn[o]; ++t)
            acc += std::int64_t{in[(static_cast<std::size_t>(y) * iw + hlo[o] + t) * 3 + c]} * hk[o][t];
          out[(static_cast<std::size_t>(y) * ow + o) * 3 + c] = clamp8(acc);
        }
    return out;
  };
  // in (iw x h) -> out (iw x oh)
  auto vertical = [&](const std::vector<std::uint8_t>& in, int iw) {
    std::vector<std::uint8_t> out(static_cast<std::size_t>(oh) * iw * 3);
    for (int o = 0; o < oh; ++o)
      for (int x = 0; x < iw; ++x)
        for (int c = 0; c < 3; ++c) {
          std::int64_t acc = 1 << (kBits - 1);
          for (int t = 0; t < vn[o]; ++t)
            acc += std::int64_t{in[(static_cast<std::size_t>(vlo[o] + t) * iw + x) * 3 + c]} * vk[o][t];
          out[(static_cast<std::size_t>(o) * iw + x) * 3 + c] = clamp8(acc);
        }
    return out;
  };
  if (vertical_first) return horizontal(vertical(src, w), w, oh);
  return vertical(horizontal(src, w, h), ow);
}

// Pillow 13's choice, on the image it resizes (torchvision's crop: the box).
bool Pillow13VerticalFirst(double x0, double y0, double x1, double y1, int ow, int oh) {
  const int dh = static_cast<int>(std::lround(y1 - y0)) - oh, dw = static_cast<int>(std::lround(x1 - x0)) - ow;
  return dh > 0 && dh > 2 * dw;
}

// Sets the process-wide order for one test, and puts the default back.
struct PillowOrderScope {
  explicit PillowOrderScope(PillowResizeOrder order) { SetPillowResizeOrder(order); }
  ~PillowOrderScope() { SetPillowResizeOrder(PillowResizeOrder::kPillow13); }
};

TEST(Resample, EveryPathGivesPillowsArithmeticExactlyInEitherReleasesPassOrder) {
  ASSERT_EQ(GetPillowResizeOrder(), PillowResizeOrder::kPillow13);  // the default
  Rng rng(9, 1);
  const int w = 517, h = 389;
  std::vector<std::uint8_t> src(static_cast<std::size_t>(w) * h * 3);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng.Next() % 4 == 0 ? 255 : rng.Next() % 256);  // many 255s
  const ImageView view{src.data(), w, h, static_cast<std::size_t>(w) * 3};
  ResampleScratch scratch;
  int vertical_first = 0, orders_differ = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const double x0 = static_cast<double>(rng.Next() % 2000) / 10, y0 = static_cast<double>(rng.Next() % 1500) / 10;
    const double x1 = x0 + 1 + static_cast<double>(rng.Next() % static_cast<std::uint64_t>((w - x0 - 1) * 10)) / 10;
    const double y1 = y0 + 1 + static_cast<double>(rng.Next() % static_cast<std::uint64_t>((h - y0 - 1) * 10)) / 10;
    // Downscales of up to 40x, upscales, odd and even sizes.
    const int ow = 1 + static_cast<int>(rng.Next() % 300), oh = 1 + static_cast<int>(rng.Next() % 300);
    std::vector<std::uint8_t> ours(static_cast<std::size_t>(ow) * oh * 3), before13(ours.size());
    {
      PillowOrderScope order(PillowResizeOrder::kBefore13);
      ASSERT_TRUE(ResampleBilinear(view, x0, y0, x1, y1, ow, oh, before13.data(), scratch));
    }
    ASSERT_EQ(before13, PillowBilinear(src, w, h, x0, y0, x1, y1, ow, oh))
        << "Pillow 12: box " << x0 << "," << y0 << "-" << x1 << "," << y1 << " to " << ow << "x" << oh;
    const bool vfirst = Pillow13VerticalFirst(x0, y0, x1, y1, ow, oh);
    // Guard bytes after the output: the passes write no byte past it.
    std::vector<std::uint8_t> guarded(ours.size() + 32, 0xAB);
    ASSERT_TRUE(ResampleBilinear(view, x0, y0, x1, y1, ow, oh, guarded.data(), scratch));
    ASSERT_TRUE(std::all_of(guarded.begin() + static_cast<std::ptrdiff_t>(ours.size()), guarded.end(),
                            [](std::uint8_t b) { return b == 0xAB; }))
        << "wrote past the output: " << ow << "x" << oh;
    ours.assign(guarded.begin(), guarded.begin() + static_cast<std::ptrdiff_t>(ours.size()));
    ASSERT_EQ(ours, PillowBilinear(src, w, h, x0, y0, x1, y1, ow, oh, vfirst))
        << "Pillow 13 (vertical first: " << vfirst << "): box " << x0 << "," << y0 << "-" << x1 << "," << y1 << " to "
        << ow << "x" << oh;
    vertical_first += vfirst;
    orders_differ += ours != before13;
  }
  // Both orders ran, and the order shows in the pixels.
  EXPECT_GE(vertical_first, 10);
  EXPECT_LE(vertical_first, 70);
  EXPECT_GE(orders_differ, 5);
}

// torchvision's RandomResizedCrop of a 174x196 crop to 160x160: the height
// shrinks by 36, more than twice the width's 14, so Pillow 13 runs the
// vertical pass first; this shape is where Pillow 12 and 13 were seen to
// differ (by one level on a quarter of the values).
TEST(Resample, ACropResizedAsPillow13DoesIsNotPillow12s) {
  Rng rng(3, 7);
  const int w = 174, h = 196;
  std::vector<std::uint8_t> src(static_cast<std::size_t>(w) * h * 3);
  for (auto& b : src) b = static_cast<std::uint8_t>(rng.Next() % 256);
  const ImageView view{src.data(), w, h, static_cast<std::size_t>(w) * 3};
  ResampleScratch scratch;
  std::vector<std::uint8_t> ours(160 * 160 * 3);
  ASSERT_TRUE(ResampleBilinear(view, 0, 0, w, h, 160, 160, ours.data(), scratch));
  EXPECT_EQ(ours, PillowBilinear(src, w, h, 0, 0, w, h, 160, 160, /*vertical_first=*/true));
  EXPECT_NE(ours, PillowBilinear(src, w, h, 0, 0, w, h, 160, 160, /*vertical_first=*/false));
}

TEST(Resample, IdentityAndConstantImages) {
  std::vector<std::uint8_t> img(40 * 30 * 3);
  for (std::size_t i = 0; i < img.size(); ++i) img[i] = static_cast<std::uint8_t>(i * 37);
  ImageView v{img.data(), 40, 30, 40 * 3};
  ResampleScratch s;
  std::vector<std::uint8_t> out(40 * 30 * 3);
  ASSERT_TRUE(ResampleBilinear(v, 0, 0, 40, 30, 40, 30, out.data(), s));
  EXPECT_EQ(out, img);
  std::vector<std::uint8_t> flat(97 * 61 * 3, 200);
  ImageView fv{flat.data(), 97, 61, 97 * 3};
  std::vector<std::uint8_t> small(13 * 7 * 3);
  ASSERT_TRUE(ResampleBilinear(fv, 3.5, 2.25, 90, 60, 13, 7, small.data(), s));
  for (auto px : small) EXPECT_EQ(px, 200);
  EXPECT_FALSE(ResampleBilinear(fv, 0, 0, 98, 61, 13, 7, small.data(), s));  // box outside
  // Any reduction works (97x to one pixel here), as in Pillow: a constant
  // image stays constant, and a ramp averages to its middle.
  ASSERT_TRUE(ResampleBilinear(fv, 0, 0, 97, 61, 1, 1, small.data(), s));
  EXPECT_EQ(small[0], 200);
  std::vector<std::uint8_t> ramp(1000 * 1 * 3);
  for (int x = 0; x < 1000; ++x)
    for (int c = 0; c < 3; ++c) ramp[x * 3 + c] = static_cast<std::uint8_t>(x * 255 / 999);
  ImageView rv{ramp.data(), 1000, 1, 1000 * 3};
  std::uint8_t one[3];
  ASSERT_TRUE(ResampleBilinear(rv, 0, 0, 1000, 1, 1, 1, one, s));
  EXPECT_NEAR(one[0], 127, 1);
}

TEST(Output, NormalisesIntoEveryDtypeAndLayout) {
  std::vector<std::uint8_t> rgb = {0, 128, 255, 10, 20, 30};  // 2x1 image
  OutputWriter f32(DType::kFloat32, Layout::kNCHW, true, {0.5f, 0.5f, 0.5f}, {0.25f, 0.5f, 1.0f});
  float out[6];
  f32.Write(rgb.data(), 2, 1, false, out);
  EXPECT_FLOAT_EQ(out[0], (0.0f - 0.5f) / 0.25f);            // R of pixel 0
  EXPECT_FLOAT_EQ(out[1], (10.0f / 255.0f - 0.5f) / 0.25f);  // R of pixel 1
  EXPECT_FLOAT_EQ(out[2], (128.0f / 255.0f - 0.5f) / 0.5f);  // G plane
  f32.Write(rgb.data(), 2, 1, true, out);                    // flipped
  EXPECT_FLOAT_EQ(out[0], (10.0f / 255.0f - 0.5f) / 0.25f);
  OutputWriter u8(DType::kUint8, Layout::kNHWC, false, {}, {});
  std::uint8_t o8[6];
  u8.Write(rgb.data(), 2, 1, true, o8);
  EXPECT_EQ(o8[0], 10);
  EXPECT_EQ(o8[3], 0);
  OutputWriter bf(DType::kBFloat16, Layout::kNCHW, true, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  OutputWriter hf(DType::kFloat16, Layout::kNCHW, true, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  OutputWriter fl(DType::kFloat32, Layout::kNCHW, true, {0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f});
  std::uint16_t ob[6], oh[6];
  float of[6];
  bf.Write(rgb.data(), 2, 1, false, ob);
  hf.Write(rgb.data(), 2, 1, false, oh);
  fl.Write(rgb.data(), 2, 1, false, of);
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(BFloat16BitsToFloat(ob[i]), of[i], std::fabs(of[i]) / 128);
    EXPECT_NEAR(HalfBitsToFloat(oh[i]), of[i], std::fabs(of[i]) / 1024 + 1e-4);
  }
}

// The writer's vector paths against the definition, element by element and
// bit for bit: every dtype and layout, widths that are and are not
// multiples of its 8-pixel blocks, flipped or not, normalised or not.
TEST(Output, WritesAreTheDefinitionsBitsWhicheverPathWritesThem) {
  std::mt19937 gen(7);
  const std::array<float, 3> mean = {0.485f, 0.456f, 0.406f}, sd = {0.229f, 0.224f, 0.225f};
  for (const DType dtype : {DType::kUint8, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const auto& [normalize, layout] : {std::pair{true, Layout::kNCHW}, std::pair{false, Layout::kNCHW},
                                            std::pair{true, Layout::kNHWC}, std::pair{false, Layout::kNHWC}}) {
      const OutputWriter writer(dtype, layout, normalize, mean, sd);
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
      if (HasAvx2() && HasF16c()) {
        EXPECT_TRUE(writer.vectorised());  // the path under test
      }
#endif
      for (const int w : {224, 227, 13, 8, 5}) {
        for (const bool flip : {false, true}) {
          const int h = 3;
          std::vector<std::uint8_t> rgb(static_cast<std::size_t>(w) * h * 3);
          for (auto& b : rgb) b = static_cast<std::uint8_t>(gen());
          const std::size_t n = rgb.size(), size = DTypeSize(dtype);
          std::vector<std::uint8_t> got(n * size + 16, 0xAB), want(n * size);
          writer.Write(rgb.data(), w, h, flip, got.data());
          for (int c = 0; c < 3; ++c)
            for (int y = 0; y < h; ++y)
              for (int x = 0; x < w; ++x) {
                const std::uint8_t v = rgb[(static_cast<std::size_t>(y) * w + (flip ? w - 1 - x : x)) * 3 + c];
                float f = static_cast<float>(v) / 255.0f;
                if (normalize) f = (f - mean[c]) / sd[c];
                const std::size_t pixel = static_cast<std::size_t>(y) * w + x;
                const std::size_t at =
                    layout == Layout::kNCHW ? static_cast<std::size_t>(c) * w * h + pixel : pixel * 3 + c;
                std::uint8_t* out = want.data() + at * size;
                if (dtype == DType::kUint8) {
                  *out = v;
                } else if (dtype == DType::kFloat32) {
                  std::memcpy(out, &f, 4);
                } else {
                  const std::uint16_t bits = dtype == DType::kFloat16 ? FloatToHalfBits(f) : FloatToBFloat16Bits(f);
                  std::memcpy(out, &bits, 2);
                }
              }
          EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
              << "dtype " << static_cast<int>(dtype) << " width " << w << " flip " << flip << " normalize "
              << normalize;
          for (std::size_t i = want.size(); i < got.size(); ++i) ASSERT_EQ(got[i], 0xAB) << "wrote past the output";
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker::transform
