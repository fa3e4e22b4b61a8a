// The augmentation steps the GPU runs, written once for its kernels and
// their CPU twin (as preprocess_math.h is): plain C++17, no stoker headers
// but core/half.h and transform/color_pixel.h (the colour arithmetic the
// CPU steps use too), so both evaluate the same arithmetic in the same order.
//
// Per image, on top of ImageDesc's crop + resize:
//   1. warps before the crop (RandomRotation, RandomAffine, flips), each with
//      the Pillow engine the CPU uses (transform/warp.cc) evaluated per
//      pixel: the resize's taps read the warped image's pixels, computed
//      from the source region where they are needed;
//   2. the resized image is rounded to uint8 (as the CPU's is) into a
//      staging image, and the colour ops after the crop (ColorJitter,
//      Grayscale) run on it with transform/color.cc's arithmetic;
//   3. the final write flips it (all flips after the crop commute with the
//      colour ops, so they fold into one), normalises it into the output's
//      type and layout, and writes RandomErasing's boxes.
// The kernels must be compiled without FMA contraction (--fmad=false) for
// the double-precision warps to round as the host's do.
#pragma once

#include <cmath>
#include <cstdint>

#include "device/preprocess_math.h"
#include "transform/color_pixel.h"

namespace stoker::device {

// Pillow's engines for one warp (transform/warp.cc), as the kernel takes them.
enum WarpEngine : std::int32_t {
  kWarpTranspose = 0,  // ImagingScaleAffine with a transpose's matrix (exact per pixel)
  kWarpFixed = 1,      // affine_fixed: nearest in 16.16 fixed point
  kWarpBilinear = 2,   // the generic engine's bilinear filter, truncated
};

// One warp before the crop: Image.transform(out, AFFINE, m, ...) of an
// input of in_width x in_height pixels.
struct WarpStage {
  double m[6] = {1, 0, 0, 0, 1, 0};  // output pixel centre -> input, Pillow's data
  std::int64_t fixed[6] = {};        // kWarpFixed: Pillow's 16.16 coefficients (a0, a1, a2, a3, a4, a5)
  std::int32_t in_width = 0, in_height = 0;
  std::int32_t engine = kWarpTranspose;
  std::uint8_t fill[3] = {0, 0, 0};
  std::uint8_t pad = 0;
};
static_assert(sizeof(WarpStage) == 112, "WarpStage is copied to the GPU as is");

// Colour ops after the crop (transform::PixelOp's colour kinds).
enum PixelOpKind : std::int32_t { kOpBrightness = 0, kOpContrast = 1, kOpSaturation = 2, kOpHue = 3, kOpGrayscale = 4 };

struct PixelOpDesc {
  std::int32_t kind = kOpBrightness;
  // Blends: the factor as Pillow's C float. Hue: the shift, 0..255.
  float value = 1;
};

struct EraseDesc {
  std::int32_t top = 0, left = 0, height = 0, width = 0;
  float value[3] = {0, 0, 0};
  std::int32_t pad = 0;
};

inline constexpr int kMaxWarpStages = 4;
inline constexpr int kMaxPixelOps = 16;
inline constexpr int kMaxErases = 2;

// What the augmentation kernels do to one image beyond its ImageDesc.
struct AugmentDesc {
  // Warps before the crop (region_width > 0): the pixels at
  // ImageDesc.offset are a region of the source (region_width x
  // region_height, its top-left at (region_x, region_y) of the source), read
  // through warp_count warps (at most one of them bilinear; none when every
  // warp drawn was the identity), and ImageDesc's width x height is the
  // crop's rectangle of the last warp's output, its top-left there at
  // (crop_x, crop_y).
  std::int32_t warp_count = 0;
  std::int32_t region_x = 0, region_y = 0, region_width = 0, region_height = 0;
  std::int32_t crop_x = 0, crop_y = 0;
  std::int32_t op_count = 0;
  std::int32_t erase_count = 0;
  std::int32_t flip_left_right = 0, flip_top_bottom = 0;  // at the final write
  std::int32_t pad = 0;
  WarpStage warps[kMaxWarpStages];
  PixelOpDesc ops[kMaxPixelOps];
  EraseDesc erases[kMaxErases];
};
static_assert(sizeof(AugmentDesc) == 48 + 112 * kMaxWarpStages + 8 * kMaxPixelOps + 32 * kMaxErases,
              "AugmentDesc is copied to the GPU as is");

// ---- warps ----

// Pillow's COORD (truncation; negative and NaN are outside).
STOKER_HOST_DEVICE inline std::int32_t PillowCoord(double v) {
  if (!(v >= 0.0)) return -1;
  if (v >= 2147483647.0) return 2147483647;
  return static_cast<std::int32_t>(v);
}

STOKER_HOST_DEVICE inline std::int32_t PillowFloor(double v) {
  if (v != v) return -2147483647;
  if (v < 0.0) return v <= -2147483647.0 ? -2147483647 : static_cast<std::int32_t>(floor(v));
  return v >= 2147483647.0 ? 2147483647 : static_cast<std::int32_t>(v);
}

STOKER_HOST_DEVICE inline std::int32_t ClampI(std::int32_t v, std::int32_t lo, std::int32_t hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}

// Where a nearest engine's output pixel (x, y) reads its input; false when
// outside (the stage's fill).
STOKER_HOST_DEVICE inline bool NearestSource(const WarpStage& w, std::int32_t x, std::int32_t y, std::int32_t& xi,
                                             std::int32_t& yi) {
  if (w.engine == kWarpFixed) {
    // Pillow adds the coefficients in 32-bit ints along rows and columns:
    // the sum, wrapped to 32 bits, is the same in any order.
    const auto xx = static_cast<std::int32_t>(
        static_cast<std::uint32_t>(static_cast<std::uint64_t>(w.fixed[2] + w.fixed[1] * y + w.fixed[0] * x)));
    const auto yy = static_cast<std::int32_t>(
        static_cast<std::uint32_t>(static_cast<std::uint64_t>(w.fixed[5] + w.fixed[4] * y + w.fixed[3] * x)));
    xi = xx >> 16;
    yi = yy >> 16;
  } else {
    // A transpose's matrix (coefficients +-1 and whole offsets) accumulates
    // exactly, so the position is its direct value.
    xi = PillowCoord(w.m[2] + w.m[0] * 0.5 + w.m[0] * x);
    yi = PillowCoord(w.m[5] + w.m[4] * 0.5 + w.m[4] * y);
  }
  return xi >= 0 && xi < w.in_width && yi >= 0 && yi < w.in_height;
}

// Pixel (x, y) of the source, within the region (clamped: never read outside it).
STOKER_HOST_DEVICE inline const std::uint8_t* SourcePixel(const std::uint8_t* region, const AugmentDesc& a,
                                                          std::int32_t x, std::int32_t y) {
  const std::int32_t rx = ClampI(x - a.region_x, 0, a.region_width - 1);
  const std::int32_t ry = ClampI(y - a.region_y, 0, a.region_height - 1);
  return region + (static_cast<std::uint64_t>(ry) * a.region_width + rx) * 3;
}

// Maps pixel (x, y) of stage `from`'s output down through the nearest
// stages from..to (inclusive, descending) to the pixel of stage to's input
// it reads; false, with that stage's fill in v, when one maps outside.
STOKER_HOST_DEVICE inline bool MapNearest(const AugmentDesc& a, int from, int to, std::int32_t& x, std::int32_t& y,
                                          std::uint8_t v[3]) {
  for (int s = from; s >= to; --s) {
    const WarpStage& w = a.warps[s];
    std::int32_t xi = 0, yi = 0;
    if (!NearestSource(w, x, y, xi, yi)) {
      v[0] = w.fill[0], v[1] = w.fill[1], v[2] = w.fill[2];
      return false;
    }
    x = xi;
    y = yi;
  }
  return true;
}

// Pixel (x, y) of stage k's output, through nearest stages k..0.
STOKER_HOST_DEVICE inline void NearestChain(const std::uint8_t* region, const AugmentDesc& a, int k, std::int32_t x,
                                            std::int32_t y, std::uint8_t v[3]) {
  if (!MapNearest(a, k, 0, x, y, v)) return;
  const std::uint8_t* p = SourcePixel(region, a, x, y);
  v[0] = p[0], v[1] = p[1], v[2] = p[2];
}

// Pixel (x, y) of the last warp's output: what the CPU's chain of
// WarpAffineRegion calls draws there.
STOKER_HOST_DEVICE inline void WarpedPixel(const std::uint8_t* region, const AugmentDesc& a, std::int32_t x,
                                           std::int32_t y, std::uint8_t v[3]) {
  int s = a.warp_count - 1;
  while (s >= 0 && a.warps[s].engine != kWarpBilinear) --s;  // the bilinear stage, if any
  if (!MapNearest(a, a.warp_count - 1, s + 1, x, y, v)) return;
  if (s >= 0) {
    const WarpStage& w = a.warps[s];
    // AffineBilinear for one pixel; its four neighbours come through the
    // (nearest) stages below.
    const double xc = x + 0.5, yc = y + 0.5;
    double xin = w.m[0] * xc + w.m[1] * yc + w.m[2];
    double yin = w.m[3] * xc + w.m[4] * yc + w.m[5];
    const std::int32_t W = w.in_width, H = w.in_height;
    if (!(xin >= 0.0 && xin < W && yin >= 0.0 && yin < H)) {
      v[0] = w.fill[0], v[1] = w.fill[1], v[2] = w.fill[2];
      return;
    }
    xin -= 0.5;
    yin -= 0.5;
    const std::int32_t xi = PillowFloor(xin), yi = PillowFloor(yin);
    const double dx = xin - xi, dy = yin - yi;
    const std::int32_t x0 = ClampI(xi, 0, W - 1), x1 = ClampI(xi + 1, 0, W - 1), y0 = ClampI(yi, 0, H - 1);
    const bool has_next = yi + 1 >= 0 && yi + 1 < H;
    std::uint8_t p00[3], p10[3], p01[3] = {0, 0, 0}, p11[3] = {0, 0, 0};
    NearestChain(region, a, s - 1, x0, y0, p00);
    NearestChain(region, a, s - 1, x1, y0, p10);
    if (has_next) {
      NearestChain(region, a, s - 1, x0, yi + 1, p01);
      NearestChain(region, a, s - 1, x1, yi + 1, p11);
    }
    for (int b = 0; b < 3; ++b) {
      double v1 = p00[b] + (static_cast<int>(p10[b]) - static_cast<int>(p00[b])) * dx;
      double v2 = v1;
      if (has_next) v2 = p01[b] + (static_cast<int>(p11[b]) - static_cast<int>(p01[b])) * dx;
      v1 = v1 + (v2 - v1) * dy;
      v[b] = static_cast<std::uint8_t>(v1);
    }
    return;
  }
  const std::uint8_t* p = SourcePixel(region, a, x, y);
  v[0] = p[0], v[1] = p[1], v[2] = p[2];
}

// The resize's fetch over the warped image: tap (i, j) of the crop's rectangle.
struct WarpedRows {
  const std::uint8_t* region;
  const AugmentDesc* augment;
  STOKER_HOST_DEVICE void operator()(std::int32_t i, std::int32_t j, float v[3]) const {
    std::uint8_t p[3];
    WarpedPixel(region, *augment, augment->crop_x + i, augment->crop_y + j, p);
    v[0] = p[0], v[1] = p[1], v[2] = p[2];
  }
};

// Output pixel (ox, oy) of stage 1: the crop resized (through the warps,
// when there are any), rounded to uint8 into `staging` (the image's
// output-sized RGB staging, rows packed). Not flipped: the final write flips.
STOKER_HOST_DEVICE inline void ResizeToStaging(const std::uint8_t* pixels, const std::uint8_t* decoded,
                                               const ImageDesc& image, const AugmentDesc& a, const OutputDesc& o,
                                               std::int32_t ox, std::int32_t oy, std::uint8_t* staging) {
  const std::uint8_t* src = (image.source == 1 ? decoded : pixels) + image.offset;
  float rgb[3];
  if (a.region_width > 0) {
    ResampleAt(image, o, ox, oy, WarpedRows{src, &a}, rgb);
  } else {
    ResampleAt(image, o, ox, oy, PackedRows{src, image.width}, rgb);
  }
  std::uint8_t* p = staging + (static_cast<std::uint64_t>(oy) * o.width + ox) * 3;
  for (int c = 0; c < 3; ++c) {
    float r = rgb[c] + 0.5f;
    r = r < 0 ? 0 : (r > 255 ? 255 : r);
    p[c] = static_cast<std::uint8_t>(r);
  }
}

// ---- colour ops (transform/color_pixel.h, as transform/color.cc applies them) ----

using transform::BlendTo;
using transform::PillowLuma;
using transform::ShiftHue;

// Applies colour op `op` to one staging pixel. `mean`: the image's mean
// luma as AdjustContrast rounds it (used by kOpContrast only).
STOKER_HOST_DEVICE inline void ApplyPixelOp(const PixelOpDesc& op, std::uint8_t mean, std::uint8_t* p) {
  switch (op.kind) {
    case kOpBrightness:
      for (int b = 0; b < 3; ++b) p[b] = BlendTo(0, p[b], op.value);
      break;
    case kOpContrast:
      for (int b = 0; b < 3; ++b) p[b] = BlendTo(mean, p[b], op.value);
      break;
    case kOpSaturation: {
      const std::uint8_t luma = PillowLuma(p);
      for (int b = 0; b < 3; ++b) p[b] = BlendTo(luma, p[b], op.value);
      break;
    }
    case kOpHue:
      ShiftHue(p, static_cast<std::uint8_t>(static_cast<int>(op.value)));
      break;
    default: {  // kOpGrayscale
      const std::uint8_t luma = PillowLuma(p);
      p[0] = p[1] = p[2] = luma;
      break;
    }
  }
}

// AdjustContrast's mean: int(sum / n + 0.5) of the luma values.
STOKER_HOST_DEVICE inline std::uint8_t ContrastMean(std::uint64_t luma_sum, std::uint64_t pixels) {
  if (pixels == 0) return 0;
  return static_cast<std::uint8_t>(static_cast<int>(static_cast<double>(luma_sum) / static_cast<double>(pixels) + 0.5));
}

// ---- the final write ----

// Output pixel (ox, oy): the staging pixel the flips bring there,
// normalised into the output, or an erasure's value where a box covers it
// (the last box wins, as the CPU erases in order).
STOKER_HOST_DEVICE inline void WriteAugmented(const std::uint8_t* staging, const AugmentDesc& a, const OutputDesc& o,
                                              std::int32_t ox, std::int32_t oy, void* out) {
  for (int e = a.erase_count - 1; e >= 0; --e) {
    const EraseDesc& b = a.erases[e];
    if (oy < b.top || oy >= b.top + b.height || ox < b.left || ox >= b.left + b.width) continue;
    for (int c = 0; c < 3; ++c) {
      const std::int64_t index = OutputIndex(o, ox, oy, c);
      const float x = b.value[c];
      if (o.type == OutputType::kUint8) {
        static_cast<std::uint8_t*>(out)[index] = static_cast<std::uint8_t>(x < 0 ? 0.0f : (x > 255 ? 255.0f : x));
      } else if (o.type == OutputType::kFloat32) {
        static_cast<float*>(out)[index] = x;
      } else if (o.type == OutputType::kFloat16) {
        static_cast<std::uint16_t*>(out)[index] = FloatToHalfBits(x);
      } else {
        static_cast<std::uint16_t*>(out)[index] = FloatToBFloat16Bits(x);
      }
    }
    return;
  }
  const std::int32_t sx = a.flip_left_right ? o.width - 1 - ox : ox;
  const std::int32_t sy = a.flip_top_bottom ? o.height - 1 - oy : oy;
  const std::uint8_t* p = staging + (static_cast<std::uint64_t>(sy) * o.width + sx) * 3;
  for (int c = 0; c < 3; ++c) StoreValue(o, ox, oy, c, static_cast<float>(p[c]), out);
}

}  // namespace stoker::device
