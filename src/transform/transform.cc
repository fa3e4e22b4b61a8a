#include "transform/transform.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "transform/cpu_features.h"

namespace stoker::transform {
namespace {

// Python's round(): half to even (the default floating-point rounding mode).
int RoundHalfEven(double x) {
  return static_cast<int>(std::nearbyint(x));
}

}  // namespace

std::size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return 1;
    case DType::kFloat32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 1;
}

Box RandomResizedCropBox(int width, int height, double scale_min, double scale_max, double ratio_min, double ratio_max,
                         Rng& rng) {
  const double area = static_cast<double>(width) * height;
  const double log_lo = std::log(ratio_min), log_hi = std::log(ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.Uniform(scale_min, scale_max);
    const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
    const int w = RoundHalfEven(std::sqrt(target_area * aspect));
    const int h = RoundHalfEven(std::sqrt(target_area / aspect));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const int y = static_cast<int>(rng.IntInclusive(0, height - h));
      const int x = static_cast<int>(rng.IntInclusive(0, width - w));
      return {x, y, w, h};
    }
  }
  const double in_ratio = static_cast<double>(width) / height;
  int w = width, h = height;
  if (in_ratio < std::min(ratio_min, ratio_max)) {
    h = RoundHalfEven(w / std::min(ratio_min, ratio_max));
  } else if (in_ratio > std::max(ratio_min, ratio_max)) {
    w = RoundHalfEven(h * std::max(ratio_min, ratio_max));
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

ResizeCenterCrop PlanResizeCenterCrop(int width, int height, int resize, int crop_w, int crop_h) {
  int new_w = resize, new_h = resize;
  if (width <= height) {
    new_h = static_cast<int>(static_cast<double>(resize) * height / width);
  } else {
    new_w = static_cast<int>(static_cast<double>(resize) * width / height);
  }
  return {new_w, new_h, RoundHalfEven((new_w - crop_w) / 2.0), RoundHalfEven((new_h - crop_h) / 2.0)};
}

FloatBox ResizeCenterCropBox(int width, int height, int resize, int crop_w, int crop_h) {
  const ResizeCenterCrop p = PlanResizeCenterCrop(width, height, resize, crop_w, crop_h);
  const double sx = static_cast<double>(width) / p.resized_w, sy = static_cast<double>(height) / p.resized_h;
  return {p.left * sx, p.top * sy, (p.left + crop_w) * sx, (p.top + crop_h) * sy};
}

OutputWriter::OutputWriter(DType dtype, Layout layout, bool normalize, std::array<float, 3> mean,
                           std::array<float, 3> std)
    : dtype_(dtype), layout_(layout) {
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      // Same operation order as torchvision: to_tensor (v / 255), then normalize.
      float x = static_cast<float>(v) / 255.0f;
      if (normalize) x = (x - mean[c]) / std[c];
      f32_[c][v] = x;
      u16_[c][v] = dtype == DType::kBFloat16 ? FloatToBFloat16Bits(x) : FloatToHalfBits(x);
    }
    constants_.mean[c] = mean[c];
    constants_.std[c] = std[c];
  }
  constants_.normalize = normalize;
  vector_path_ = VectorPathMatchesTables();
}

bool OutputWriter::VectorPathMatchesTables() const {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (!HasAvx2() || !HasF16c()) return false;
  // Every byte value in every channel, once forwards and once flipped: the
  // vector path is used only where it writes exactly the tables' elements.
  std::array<std::uint8_t, 256 * 3> ramp;
  for (int v = 0; v < 256; ++v)
    for (int c = 0; c < 3; ++c) ramp[static_cast<std::size_t>(v) * 3 + c] = static_cast<std::uint8_t>(v ^ (c * 85));
  std::array<std::uint32_t, 256 * 3> fast, plain;
  for (const bool flip : {false, true}) {
    WriteVector(ramp.data(), 256, 1, 32, flip, fast.data());
    WriteScalar(ramp.data(), 256, 1, flip, 0, plain.data());
    if (std::memcmp(fast.data(), plain.data(), 256 * 3 * DTypeSize(dtype_)) != 0) return false;
  }
  return true;
#else
  return false;
#endif
}

void OutputWriter::WriteVector(const std::uint8_t* rgb, int out_w, int out_h, int blocks, bool flip, void* dst) const {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  WriteRowsAvx2(PlaneFormatOf(dtype_), layout_ == Layout::kNCHW, constants_, rgb, out_w, out_h, blocks, flip, dst);
#else
  (void)rgb, (void)out_w, (void)out_h, (void)blocks, (void)flip, (void)dst;
#endif
}

PlaneFormat OutputWriter::PlaneFormatOf(DType dtype) {
  switch (dtype) {
    case DType::kUint8:
      return PlaneFormat::kUint8;
    case DType::kFloat32:
      return PlaneFormat::kFloat32;
    case DType::kFloat16:
      return PlaneFormat::kFloat16;
    case DType::kBFloat16:
      return PlaneFormat::kBFloat16;
  }
  return PlaneFormat::kUint8;
}

void OutputWriter::Write(const std::uint8_t* rgb, int out_w, int out_h, bool flip, void* dst) const {
  if (dtype_ == DType::kUint8 && layout_ == Layout::kNHWC && !flip) {
    std::memcpy(dst, rgb, static_cast<std::size_t>(out_w) * out_h * 3);
    return;
  }
  int x_from = 0;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (vector_path_) {
    WriteVector(rgb, out_w, out_h, out_w / 8, flip, dst);
    x_from = out_w / 8 * 8;
    if (x_from == out_w) return;
  }
#endif
  WriteScalar(rgb, out_w, out_h, flip, x_from, dst);
}

STOKER_SIMD_CLONES void OutputWriter::WriteScalar(const std::uint8_t* rgb, int out_w, int out_h, bool flip, int x_from,
                                                  void* dst) const {
  const std::size_t plane = static_cast<std::size_t>(out_w) * out_h;
  auto src_index = [&](int y, int x) {
    return (static_cast<std::size_t>(y) * out_w + static_cast<std::size_t>(flip ? out_w - 1 - x : x)) * 3;
  };
  auto write_all = [&](auto* out, auto convert) {
    for (int y = 0; y < out_h; ++y) {
      for (int x = x_from; x < out_w; ++x) {
        const std::uint8_t* p = rgb + src_index(y, x);
        const std::size_t pixel = static_cast<std::size_t>(y) * out_w + x;
        for (int c = 0; c < 3; ++c) {
          const std::size_t at = layout_ == Layout::kNCHW ? c * plane + pixel : pixel * 3 + c;
          out[at] = convert(c, p[c]);
        }
      }
    }
  };
  switch (dtype_) {
    case DType::kUint8:
      if (layout_ == Layout::kNHWC && !flip && x_from == 0) {
        std::memcpy(dst, rgb, plane * 3);
        return;
      }
      write_all(static_cast<std::uint8_t*>(dst), [](int, std::uint8_t v) { return v; });
      return;
    case DType::kFloat32:
      write_all(static_cast<float*>(dst), [this](int c, std::uint8_t v) { return f32_[c][v]; });
      return;
    case DType::kFloat16:
    case DType::kBFloat16:
      write_all(static_cast<std::uint16_t*>(dst), [this](int c, std::uint8_t v) { return u16_[c][v]; });
      return;
  }
}

}  // namespace stoker::transform
