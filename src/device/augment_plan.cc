#include "device/augment_plan.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

namespace stoker::device {
namespace {

bool FixedPointHolds(const transform::AffineMatrix& m, double x, double y) {
  return std::fabs(x * m[0] + y * m[1] + m[2]) < 32768.0 && std::fabs(x * m[3] + y * m[4] + m[5]) < 32768.0;
}

std::int64_t Fix16(double v) {
  return static_cast<std::int64_t>(std::floor(v * 65536.0 + 0.5));
}

bool IsTranspose(const transform::AffineMatrix& m) {
  const auto unit = [](double v) { return v == 1.0 || v == -1.0; };
  return unit(m[0]) && unit(m[4]) && m[2] == std::floor(m[2]) && m[5] == std::floor(m[5]);
}

}  // namespace

bool KernelWarps(std::span<const transform::Step::PartWarp> warps, std::span<const transform::Size> sizes,
                 AugmentDesc& augment) {
  int count = 0, bilinear = 0;
  for (std::size_t i = 0; i < warps.size(); ++i) {
    const transform::Step::PartWarp& w = warps[i];
    const transform::AffineMatrix& m = w.matrix;
    const transform::Size in = sizes[i], out = sizes[i + 1];
    WarpStage stage;
    std::copy(m.begin(), m.end(), stage.m);
    stage.in_width = in.width;
    stage.in_height = in.height;
    std::copy(w.fill.begin(), w.fill.end(), stage.fill);
    if (w.interpolation == transform::Interpolation::kBilinear) {
      stage.engine = kWarpBilinear;
      ++bilinear;
    } else if (m[1] == 0 && m[3] == 0) {
      // Pillow's scale engine accumulates positions along the row: only a
      // transpose's (exact) positions are the same computed per pixel.
      if (!IsTranspose(m)) return false;
      if (m[0] == 1 && m[4] == 1 && m[2] == 0 && m[5] == 0 && in == out) continue;  // the identity
      stage.engine = kWarpTranspose;
    } else if (FixedPointHolds(m, 0, 0) && FixedPointHolds(m, out.width, out.height) &&
               FixedPointHolds(m, 0, out.height) && FixedPointHolds(m, out.width, 0)) {
      stage.engine = kWarpFixed;
      stage.fixed[0] = Fix16(m[0]);
      stage.fixed[1] = Fix16(m[1]);
      stage.fixed[2] = Fix16(m[2] + m[0] * 0.5 + m[1] * 0.5);
      stage.fixed[3] = Fix16(m[3]);
      stage.fixed[4] = Fix16(m[4]);
      stage.fixed[5] = Fix16(m[5] + m[3] * 0.5 + m[4] * 0.5);
    } else {
      return false;  // Pillow's floating-point nearest engine accumulates too
    }
    if (count == kMaxWarpStages || bilinear > 1) return false;
    augment.warps[count++] = stage;
  }
  augment.warp_count = count;
  return true;
}

Status DescribeProgram(const transform::PixelProgram& program, bool flip, AugmentDesc& augment) {
  augment.flip_left_right = flip ? 1 : 0;
  for (const transform::PixelOp& op : program.ops) {
    using Kind = transform::PixelOp::Kind;
    if (op.kind == Kind::kFlipLeftRight) {
      augment.flip_left_right ^= 1;
      continue;
    }
    if (op.kind == Kind::kFlipTopBottom) {
      augment.flip_top_bottom ^= 1;
      continue;
    }
    if (augment.op_count == kMaxPixelOps)
      return Status::InvalidArgument(fmt::format(
          "the sample's steps after the crop drew more than the {} colour operations the GPU's augmentation kernels "
          "take: use gpu_preprocess=False",
          kMaxPixelOps));
    PixelOpDesc& d = augment.ops[augment.op_count++];
    switch (op.kind) {
      case Kind::kBrightness:
        d = {kOpBrightness, static_cast<float>(op.factor)};
        break;
      case Kind::kContrast:
        d = {kOpContrast, static_cast<float>(op.factor)};
        break;
      case Kind::kSaturation:
        d = {kOpSaturation, static_cast<float>(op.factor)};
        break;
      case Kind::kHue:  // np.uint8(hue_factor * 255), as AdjustHue shifts
        d = {kOpHue, static_cast<float>(static_cast<std::uint8_t>(static_cast<int>(op.factor * 255)))};
        break;
      default:
        d = {kOpGrayscale, 0};
        break;
    }
  }
  if (program.erases.size() > static_cast<std::size_t>(kMaxErases))
    return Status::InvalidArgument(fmt::format(
        "{} erasures drawn, more than the {} the GPU's augmentation kernels take", program.erases.size(), kMaxErases));
  for (const transform::TensorErase& e : program.erases) {
    EraseDesc& d = augment.erases[augment.erase_count++];
    d = {e.top, e.left, e.height, e.width, {e.value[0], e.value[1], e.value[2]}, 0};
  }
  return Status::Ok();
}

}  // namespace stoker::device
