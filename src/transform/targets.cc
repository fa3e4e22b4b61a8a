#include "transform/targets.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "transform/warp.h"

namespace stoker::transform {
namespace {

// Calls `each(move_points, size_after)` for every move in order: the steps
// before the crop, the crop stage, its flip, the steps after.
template <typename Each>
void ForEachMove(const SampleGeometry& g, Each each) {
  for (const auto& m : g.before) {
    each([&m](std::span<double> xy) { m.step->MapPoints(m.params, m.in, xy); }, m.step->OutputSizeFor(m.params, m.in));
  }
  if (g.crop == SampleGeometry::Crop::kBox) {
    const double x0 = g.box[0], y0 = g.box[1];
    const double sx = g.out.width / (g.box[2] - g.box[0]), sy = g.out.height / (g.box[3] - g.box[1]);
    each(
        [&](std::span<double> xy) {
          for (std::size_t i = 0; i + 1 < xy.size(); i += 2) {
            xy[i] = (xy[i] - x0) * sx;
            xy[i + 1] = (xy[i + 1] - y0) * sy;
          }
        },
        g.out);
  } else if (g.crop == SampleGeometry::Crop::kResizeThenCenter) {
    const Size in =
        g.before.empty() ? g.source : g.before.back().step->OutputSizeFor(g.before.back().params, g.before.back().in);
    const double sx = static_cast<double>(g.resized.width) / in.width;
    const double sy = static_cast<double>(g.resized.height) / in.height;
    each(
        [&](std::span<double> xy) {
          for (std::size_t i = 0; i + 1 < xy.size(); i += 2) {
            xy[i] = xy[i] * sx - g.crop_left;
            xy[i + 1] = xy[i + 1] * sy - g.crop_top;
          }
        },
        g.out);
  }
  if (g.flip) {
    each(
        [&](std::span<double> xy) {
          for (std::size_t i = 0; i + 1 < xy.size(); i += 2) xy[i] = g.out.width - xy[i];
        },
        g.out);
  }
  for (const auto& m : g.after) {
    each([&m](std::span<double> xy) { m.step->MapPoints(m.params, m.in, xy); }, m.step->OutputSizeFor(m.params, m.in));
  }
}

}  // namespace

std::vector<bool> FollowBoxes(const SampleGeometry& g, std::span<float> xyxy) {
  const std::size_t n = xyxy.size() / 4;
  std::vector<std::array<double, 4>> boxes(n);
  for (std::size_t i = 0; i < n; ++i)
    for (int k = 0; k < 4; ++k) boxes[i][static_cast<std::size_t>(k)] = xyxy[i * 4 + static_cast<std::size_t>(k)];
  ForEachMove(g, [&](auto move, Size size) {
    for (auto& b : boxes) {
      std::array<double, 8> corners{b[0], b[1], b[2], b[1], b[2], b[3], b[0], b[3]};
      move(corners);
      double x1 = INFINITY, y1 = INFINITY, x2 = -INFINITY, y2 = -INFINITY;
      for (std::size_t c = 0; c < 8; c += 2) {
        x1 = std::min(x1, corners[c]);
        x2 = std::max(x2, corners[c]);
        y1 = std::min(y1, corners[c + 1]);
        y2 = std::max(y2, corners[c + 1]);
      }
      b = {std::clamp(x1, 0.0, static_cast<double>(size.width)), std::clamp(y1, 0.0, static_cast<double>(size.height)),
           std::clamp(x2, 0.0, static_cast<double>(size.width)), std::clamp(y2, 0.0, static_cast<double>(size.height))};
    }
  });
  std::vector<bool> keep(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (int k = 0; k < 4; ++k)
      xyxy[i * 4 + static_cast<std::size_t>(k)] = static_cast<float>(boxes[i][static_cast<std::size_t>(k)]);
    keep[i] = boxes[i][2] > boxes[i][0] && boxes[i][3] > boxes[i][1];
  }
  return keep;
}

void FollowPoints(const SampleGeometry& g, std::span<double> xy) {
  ForEachMove(g, [&](auto move, Size) { move(xy); });
}

Status FollowMask(const SampleGeometry& g, Image& mask, Image& scratch, std::uint8_t fill) {
  if (!(mask.size() == g.source))
    return Status::InvalidArgument(
        fmt::format("the mask is {}x{}, its image {}x{}: a mask follows an image of its size", mask.width, mask.height,
                    g.source.width, g.source.height));
  const bool in_parts =
      g.crop == SampleGeometry::Crop::kBox && !g.before.empty() && g.regions.size() == g.before.size() + 1;
  if (in_parts) {
    // Only the crop's part of each warp, as the image drew it (nearest, the
    // mask's fill); the last part is the crop box itself.
    int ox = 0, oy = 0;
    for (std::size_t i = 0; i < g.before.size(); ++i) {
      const auto& m = g.before[i];
      const auto warp = m.step->WarpFor(m.params, m.in);
      if (!warp) return Status::Internal("a warp the image drew in part is no warp for its mask");
      WarpAffineRegion(mask, ox, oy, m.in, warp->matrix, Interpolation::kNearest, MaskFill(fill), warp->out,
                       g.regions[i + 1], scratch);
      std::swap(mask, scratch);
      ox = g.regions[i + 1].x;
      oy = g.regions[i + 1].y;
    }
    ResizeNearest(mask, g.out, scratch);
    std::swap(mask, scratch);
  } else {
    for (const auto& m : g.before) STOKER_RETURN_IF_ERROR(m.step->ApplyToMask(m.params, mask, scratch, fill));
    if (g.crop == SampleGeometry::Crop::kBox) {
      const int x0 = static_cast<int>(g.box[0]), y0 = static_cast<int>(g.box[1]);
      const int w = static_cast<int>(g.box[2] - g.box[0]), h = static_cast<int>(g.box[3] - g.box[1]);
      scratch.Reset(w, h, mask.channels);
      for (int y = 0; y < h; ++y)
        std::copy_n(mask.row(y0 + y) + static_cast<std::size_t>(x0) * mask.channels,
                    static_cast<std::size_t>(w) * mask.channels, scratch.row(y));
      ResizeNearest(scratch, g.out, mask);
    } else if (g.crop == SampleGeometry::Crop::kResizeThenCenter) {
      ResizeNearest(mask, g.resized, scratch);
      mask.Reset(g.out.width, g.out.height, scratch.channels);
      for (int y = 0; y < g.out.height; ++y)
        std::copy_n(scratch.row(g.crop_top + y) + static_cast<std::size_t>(g.crop_left) * scratch.channels,
                    static_cast<std::size_t>(g.out.width) * scratch.channels, mask.row(y));
    }
  }
  if (g.flip) {
    TransposeImage(mask, Transpose::kFlipLeftRight, scratch);
    std::swap(mask, scratch);
  }
  for (const auto& m : g.after) STOKER_RETURN_IF_ERROR(m.step->ApplyToMask(m.params, mask, scratch, fill));
  return Status::Ok();
}

}  // namespace stoker::transform
