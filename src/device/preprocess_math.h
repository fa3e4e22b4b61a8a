// The last preprocessing steps, written once for both the GPU kernel and its
// CPU twin: crop box -> bilinear (triangle-filter, antialiased when
// shrinking) resize -> horizontal flip -> normalise -> dtype, from uint8 RGB
// (HWC) to NCHW or NHWC. Compiled by nvcc for the kernel and by the C++
// compiler for the twin; plain C++17 on purpose (no stoker headers but core/half.h), so the
// two evaluate the same arithmetic in the same order.
#pragma once

#include <cstdint>

#include "core/half.h"  // also plain C++17: the float -> half / bfloat16 conversions

namespace stoker::device {

// Output element types (values match stoker::DType).
enum class OutputType : std::uint8_t { kUint8 = 0, kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3 };

// One decoded image in the batch's input buffer and what to do with it.
struct ImageDesc {
  std::uint64_t offset = 0;  // of its first byte, from the start of the pixel area
  std::int32_t width = 0;    // of the decoded image, pixels (RGB, 3 bytes each, rows packed)
  std::int32_t height = 0;
  // The crop box in decoded-image pixel coordinates (may be fractional).
  float x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  std::int32_t flip = 0;  // mirror horizontally
  // Where the pixels are: 0, the batch's pixel area (decoded on the CPU and
  // copied); 1, the decode area the GPU's JPEG decoder wrote (decode="gpu").
  std::int32_t source = 0;
};
static_assert(sizeof(ImageDesc) == 40, "ImageDesc is copied to the GPU as is");

struct OutputDesc {
  std::int32_t width = 0, height = 0;
  OutputType type = OutputType::kFloat32;
  std::int32_t channels_last = 0;  // NHWC when set, NCHW otherwise
  std::int32_t normalize = 1;
  float mean[3] = {0, 0, 0};
  float inv_std[3] = {1, 1, 1};
};

// Source taps of one output coordinate along one axis.
struct Taps {
  float center = 0;
  float support = 1;
  std::int32_t first = 0, last = 0;  // inclusive source range
};

STOKER_HOST_DEVICE inline float AbsF(float x) {
  return x < 0 ? -x : x;
}
STOKER_HOST_DEVICE inline float MaxF(float a, float b) {
  return a > b ? a : b;
}
STOKER_HOST_DEVICE inline std::int32_t MaxI(std::int32_t a, std::int32_t b) {
  return a > b ? a : b;
}
STOKER_HOST_DEVICE inline std::int32_t MinI(std::int32_t a, std::int32_t b) {
  return a < b ? a : b;
}
STOKER_HOST_DEVICE inline std::int32_t FloorI(float x) {
  const auto i = static_cast<std::int32_t>(x);
  return (static_cast<float>(i) > x) ? i - 1 : i;
}

// Output coordinate `o` of `n` samples the box [b0, b1) of a source axis of
// `size` pixels: the triangle filter is widened by the scale when shrinking
// (antialiasing), and taps stay inside both the box's pixels and the image.
STOKER_HOST_DEVICE inline Taps AxisTaps(std::int32_t o, std::int32_t n, float b0, float b1, std::int32_t size) {
  Taps t;
  const float scale = (b1 - b0) / static_cast<float>(n);
  t.support = MaxF(scale, 1.0f);
  t.center = b0 + (static_cast<float>(o) + 0.5f) * scale;
  const std::int32_t lo = MaxI(FloorI(b0), 0);
  const std::int32_t hi = MinI(FloorI(b1 - 1e-4f), size - 1);
  t.first = MaxI(FloorI(t.center - t.support - 0.5f), lo);
  t.last = MinI(FloorI(t.center + t.support - 0.5f) + 1, hi);
  if (t.last < t.first) t.last = t.first;  // degenerate box: nearest pixel
  return t;
}

STOKER_HOST_DEVICE inline float TapWeight(const Taps& t, std::int32_t i) {
  const float w = 1.0f - AbsF((static_cast<float>(i) + 0.5f - t.center) / t.support);
  return w > 0 ? w : 0;
}

// Bytes of one output image.
STOKER_HOST_DEVICE inline std::uint64_t OutputImageBytes(const OutputDesc& o) {
  const std::uint64_t element = o.type == OutputType::kUint8 ? 1 : o.type == OutputType::kFloat32 ? 4 : 2;
  return static_cast<std::uint64_t>(o.width) * static_cast<std::uint64_t>(o.height) * 3 * element;
}

// Index of channel c of output pixel (ox, oy) in the output's layout.
STOKER_HOST_DEVICE inline std::int64_t OutputIndex(const OutputDesc& o, std::int32_t ox, std::int32_t oy, int c) {
  const std::int64_t plane = static_cast<std::int64_t>(o.width) * o.height;
  return o.channels_last ? (static_cast<std::int64_t>(oy) * o.width + ox) * 3 + c
                         : c * plane + static_cast<std::int64_t>(oy) * o.width + ox;
}

// Stores value `v` (0..255) of channel c at output pixel (ox, oy): rounded
// (uint8), or scaled to 0..1 and normalised, in the output's type.
STOKER_HOST_DEVICE inline void StoreValue(const OutputDesc& o, std::int32_t ox, std::int32_t oy, int c, float v,
                                          void* out) {
  const std::int64_t index = OutputIndex(o, ox, oy, c);
  if (o.type == OutputType::kUint8) {
    float r = v + 0.5f;
    r = r < 0 ? 0 : (r > 255 ? 255 : r);
    static_cast<std::uint8_t*>(out)[index] = static_cast<std::uint8_t>(r);
    return;
  }
  const float x = o.normalize ? (v * (1.0f / 255.0f) - o.mean[c]) * o.inv_std[c] : v * (1.0f / 255.0f);
  if (o.type == OutputType::kFloat32) {
    static_cast<float*>(out)[index] = x;
  } else if (o.type == OutputType::kFloat16) {
    static_cast<std::uint16_t*>(out)[index] = FloatToHalfBits(x);
  } else {
    static_cast<std::uint16_t*>(out)[index] = FloatToBFloat16Bits(x);
  }
}

// The resampled value (0..255 per channel) of output pixel (ox, oy) of
// `o` from the crop box of `image`: `fetch(i, j, rgb)` gives the box's
// pixel (i, j) of an image of image.width x image.height as three floats.
// The flip is applied by the caller (it mirrors ox).
template <typename Fetch>
STOKER_HOST_DEVICE inline void ResampleAt(const ImageDesc& image, const OutputDesc& o, std::int32_t ox, std::int32_t oy,
                                          const Fetch& fetch, float rgb[3]) {
  const Taps tx = AxisTaps(ox, o.width, image.x0, image.x1, image.width);
  const Taps ty = AxisTaps(oy, o.height, image.y0, image.y1, image.height);
  float acc[3] = {0, 0, 0};
  float weight_sum = 0;
  for (std::int32_t j = ty.first; j <= ty.last; ++j) {
    const float wy = TapWeight(ty, j);
    if (wy == 0) continue;
    float row[3] = {0, 0, 0};
    float row_weight = 0;
    for (std::int32_t i = tx.first; i <= tx.last; ++i) {
      const float wx = TapWeight(tx, i);
      if (wx == 0) continue;
      float v[3];
      fetch(i, j, v);
      row[0] += wx * v[0];
      row[1] += wx * v[1];
      row[2] += wx * v[2];
      row_weight += wx;
    }
    acc[0] += wy * row[0];
    acc[1] += wy * row[1];
    acc[2] += wy * row[2];
    weight_sum += wy * row_weight;
  }
  const float inv = weight_sum > 0 ? 1.0f / weight_sum : 0.0f;
  for (int c = 0; c < 3; ++c) rgb[c] = acc[c] * inv;
}

// Pixels of packed RGB rows (`width` pixels each).
struct PackedRows {
  const std::uint8_t* pixels;
  std::int32_t width;
  STOKER_HOST_DEVICE void operator()(std::int32_t i, std::int32_t j, float v[3]) const {
    const std::uint8_t* p = pixels + (static_cast<std::uint64_t>(j) * width + i) * 3;
    v[0] = static_cast<float>(p[0]);
    v[1] = static_cast<float>(p[1]);
    v[2] = static_cast<float>(p[2]);
  }
};

// Computes output pixel (ox, oy) of one image and stores it into `out` (the
// image's first element) in the output type and layout. `decoded` is the
// decode area (images with source 1); may be null when none uses it.
STOKER_HOST_DEVICE inline void PreprocessPixel(const std::uint8_t* pixels, const std::uint8_t* decoded,
                                               const ImageDesc& image, const OutputDesc& o, std::int32_t ox,
                                               std::int32_t oy, void* out) {
  // The flip mirrors where output pixel ox samples from.
  const std::int32_t sample_x = image.flip ? o.width - 1 - ox : ox;
  const PackedRows rows{(image.source == 1 ? decoded : pixels) + image.offset, image.width};
  float rgb[3];
  ResampleAt(image, o, sample_x, oy, rows, rgb);
  for (int c = 0; c < 3; ++c) StoreValue(o, ox, oy, c, rgb[c], out);
}

}  // namespace stoker::device
