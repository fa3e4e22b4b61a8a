// Image transforms with torchvision's semantics (for PIL images), fused:
// crop box selection (RandomResizedCrop, Resize + CenterCrop), bilinear
// resampling of just that box, then flip, normalisation, layout and dtype
// conversion in one final write.
#pragma once

#include <array>
#include <cstdint>

#include "core/rng.h"
#include "stoker/types.h"
#include "transform/output_writer_avx2.h"
#include "transform/resample.h"

namespace stoker::transform {

using stoker::DType;
using stoker::Layout;

[[nodiscard]] std::size_t DTypeSize(DType dtype);

// A crop box in source pixels (integers, as torchvision's crops are).
struct Box {
  int x = 0, y = 0, width = 0, height = 0;
};

// torchvision.transforms.RandomResizedCrop.get_params: up to 10 tries of a
// random area fraction in [scale_min, scale_max] and a log-uniform aspect
// ratio in [ratio_min, ratio_max], then the central fallback. Python's
// round-half-to-even is kept.
[[nodiscard]] Box RandomResizedCropBox(int width, int height, double scale_min, double scale_max, double ratio_min,
                                       double ratio_max, Rng& rng);

// The source-space box that Resize(resize) followed by CenterCrop(crop_h,
// crop_w) keeps (torchvision: the shorter side becomes `resize`, the longer
// int(resize * long / short); the crop's top-left is round((h - ch) / 2)).
struct FloatBox {
  double x0 = 0, y0 = 0, x1 = 0, y1 = 0;
};
[[nodiscard]] FloatBox ResizeCenterCropBox(int width, int height, int resize, int crop_w, int crop_h);
// The same as Resize's output size and the crop's top-left in it.
struct ResizeCenterCrop {
  int resized_w = 0, resized_h = 0, left = 0, top = 0;
};
[[nodiscard]] ResizeCenterCrop PlanResizeCenterCrop(int width, int height, int resize, int crop_w, int crop_h);

// Per-channel lookup tables from a uint8 value to the output element:
// (v / 255 - mean) / std, in the output dtype. Built once per loader.
class OutputWriter {
 public:
  OutputWriter(DType dtype, Layout layout, bool normalize, std::array<float, 3> mean, std::array<float, 3> std);
  // Writes an out_w x out_h RGB image (rows of out_w * 3 bytes) to `dst`
  // (one sample's slot in the batch), mirrored horizontally when `flip`.
  // Takes a vector path (output_writer_avx2.h) where the CPU has one and it
  // reproduces the tables for every byte value (the uint8 NHWC output
  // without a flip is a copy).
  void Write(const std::uint8_t* rgb, int out_w, int out_h, bool flip, void* dst) const;
  [[nodiscard]] DType dtype() const { return dtype_; }
  [[nodiscard]] Layout layout() const { return layout_; }
  // Whether Write takes the vector path (for tests and benchmarks).
  [[nodiscard]] bool vectorised() const { return vector_path_; }

 private:
  // The table lookups, for columns x_from .. out_w - 1 of every row.
  void WriteScalar(const std::uint8_t* rgb, int out_w, int out_h, bool flip, int x_from, void* dst) const;
  [[nodiscard]] bool VectorPathMatchesTables() const;
  // The vector path's first `blocks` * 8 pixels of every row.
  void WriteVector(const std::uint8_t* rgb, int out_w, int out_h, int blocks, bool flip, void* dst) const;
  static PlaneFormat PlaneFormatOf(DType dtype);

  DType dtype_;
  Layout layout_;
  std::array<std::array<float, 256>, 3> f32_{};
  std::array<std::array<std::uint16_t, 256>, 3> u16_{};
  PlaneConstants constants_;
  bool vector_path_ = false;
};

}  // namespace stoker::transform
