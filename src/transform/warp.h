// Geometric resampling with Pillow's arithmetic, which torchvision uses for
// PIL images: Image.transform(AFFINE) with NEAREST (Pillow's three engines:
// scale-only, 16.16 fixed point, floating point) or BILINEAR (the generic
// engine; results truncated, not rounded), Image.transpose, and
// Image.rotate's matrix, fast paths and `expand` size. Matching Pillow's
// engines pixel for pixel is what lets nearest-neighbour rotation agree with
// torchvision exactly.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>

#include "transform/image.h"

namespace stoker::transform {

enum class Interpolation : std::uint8_t { kNearest, kBilinear };

// Pillow's AFFINE data (a, b, c, d, e, f): the output pixel centre
// (x + 0.5, y + 0.5) samples the input at (a x + b y + c, d x + e y + f).
using AffineMatrix = std::array<double, 6>;

// A colour for pixels that map outside the input (channel 0 for 1-channel images).
using Fill = std::array<std::uint8_t, 3>;

// Image.transform(out_size, AFFINE, m, resample, fillcolor=fill).
void WarpAffine(const Image& in, const AffineMatrix& m, Interpolation interpolation, const Fill& fill, Size out_size,
                Image& out);

struct Rect {
  int x = 0, y = 0, width = 0, height = 0;
};
// The same warp, drawing only `out_rect` of the out_size output (into `out`,
// out_rect's size), pixel for pixel what WarpAffine draws there. `in` may
// be just a part of an input of `in_size`, its top-left at (in_x, in_y):
// it must hold InputRegion(m, in_size, out_rect).
void WarpAffineRegion(const Image& in, int in_x, int in_y, Size in_size, const AffineMatrix& m,
                      Interpolation interpolation, const Fill& fill, Size out_size, Rect out_rect, Image& out);
// The input pixels the warp reads to draw `out_rect` (within the input;
// empty when it maps outside).
[[nodiscard]] Rect InputRegion(const AffineMatrix& m, Size in_size, Rect out_rect);

enum class Transpose : std::uint8_t { kFlipLeftRight, kFlipTopBottom, kRotate90, kRotate180, kRotate270 };
// Image.transpose(method).
void TransposeImage(const Image& in, Transpose method, Image& out);

// Image.rotate(angle, resample, expand, center, fillcolor=fill): angle in
// degrees, counter-clockwise; `center` in pixels (default: the image's
// centre, which also enables Pillow's exact fast paths for 0, 90, 180 and
// 270 degrees).
void RotateImage(const Image& in, double angle, Interpolation interpolation, bool expand,
                 const std::optional<std::array<double, 2>>& center, const Fill& fill, Image& out);

// The output size and matrix Image.rotate uses (no fast path taken).
struct RotationPlan {
  AffineMatrix matrix{};
  Size size;
};
[[nodiscard]] RotationPlan PlanRotation(Size in, double angle, bool expand,
                                        const std::optional<std::array<double, 2>>& center);

// torchvision.transforms.functional._get_inverse_affine_matrix (inverted):
// rotation by `angle` degrees about `center`, then scale, shear (degrees) and
// translation, as the matrix mapping output pixels to input pixels.
[[nodiscard]] AffineMatrix InverseAffineMatrix(std::array<double, 2> center, double angle,
                                               std::array<double, 2> translate, double scale,
                                               std::array<double, 2> shear);

// Maps a point through an AffineMatrix (output -> input for Pillow's data).
[[nodiscard]] std::array<double, 2> MapPoint(const AffineMatrix& m, double x, double y);
// The inverse of an invertible affine map (for moving targets forward).
[[nodiscard]] std::optional<AffineMatrix> InvertAffine(const AffineMatrix& m);

// Moves points (x, y pairs) forward through the warp whose Pillow matrix
// (output -> input) is `m`: what a box corner or keypoint does when the
// image is warped. Leaves them when `m` cannot be inverted.
void MapPointsForward(const AffineMatrix& m, std::span<double> xy);

// Nearest-neighbour resize with torch's rule (F.interpolate(mode="nearest"),
// which torchvision.transforms.v2 uses for masks): source index
// floor(i * in / out) in float32.
void ResizeNearest(const Image& in, Size out_size, Image& out);
// torch's nearest rule, which ResizeNearest follows: output position `i`
// reads floor(i * scale), scale = in / out in float32, at most in - 1.
[[nodiscard]] inline std::int64_t TorchNearestSource(std::int64_t i, float scale, std::int64_t in) {
  return std::min(static_cast<std::int64_t>(std::floor(static_cast<float>(i) * scale)), in - 1);
}

// Python's round(x, ndigits) (correctly rounded through decimal).
[[nodiscard]] double RoundDecimal(double x, int ndigits);

}  // namespace stoker::transform
