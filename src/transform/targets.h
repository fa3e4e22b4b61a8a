// Targets that follow an image (boxes, keypoints, masks): what the image's
// transform did to one sample, recorded as it ran, and the same moves
// applied to the targets, with torchvision.transforms.v2's semantics: a
// moved box becomes the box enclosing its four moved corners, clamped to
// the image after every step (a box left without area is dropped with its
// labels); masks move with nearest-neighbour sampling; keypoints move as
// points and may leave the image.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "stoker/augment.h"
#include "stoker/status.h"
#include "transform/image.h"
#include "transform/step.h"
#include "transform/warp.h"

namespace stoker::transform {

struct SampleGeometry {
  struct Move {
    const Step* step = nullptr;
    StepParams params;
    Size in;
  };
  enum class Crop : std::uint8_t { kNone, kBox, kResizeThenCenter };
  bool valid = false;
  Size source;               // the decoded image
  std::vector<Move> before;  // steps before the crop
  Crop crop = Crop::kNone;
  std::array<double, 4> box{};  // kBox: the crop (whole pixels) of the image the steps before made
  Size resized;                 // kResizeThenCenter: Resize's size, then the crop's top-left
  int crop_left = 0, crop_top = 0;
  Size out;                 // after the crop stage
  bool flip = false;        // the crop stage's horizontal flip
  std::vector<Move> after;  // steps after the crop
  // When the image drew only the crop's part of the warps before the crop:
  // the region of each warp's input it read, and the crop (one more than
  // `before`). Masks then draw only those parts too.
  std::vector<Rect> regions;

  void Clear() {
    valid = false;
    before.clear();
    after.clear();
    crop = Crop::kNone;
    flip = false;
    regions.clear();
  }
};

// Boxes (N x 4 values, x1 y1 x2 y2 in source pixels) moved through the
// geometry; returns for each whether it keeps an area (the caller drops the
// others, with their labels).
[[nodiscard]] std::vector<bool> FollowBoxes(const SampleGeometry& g, std::span<float> xyxy);
// Points (x, y pairs) moved through the geometry.
void FollowPoints(const SampleGeometry& g, std::span<double> xy);
// A label map (1 channel, the source image's size) moved through the
// geometry; InvalidArgument when its size is not the image's.
[[nodiscard]] Status FollowMask(const SampleGeometry& g, Image& mask, Image& scratch, std::uint8_t fill);

}  // namespace stoker::transform
