// A raster that follows a transformed image: a stoker.Mask (a label map
// decoded as "L", "I;16" or "RGB") or a stoker.Array with follows="image"
// (depth, bands, any element type). It takes every crop, flip, rotation,
// affine and resize the image took, with nearest-neighbour sampling, as
// torchvision.transforms.v2 moves a Mask: each value out is one of the
// raster's own, or the fill where the image moved in pixels from outside.
// Values are moved, never changed (a flow field's vectors are not turned).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/tensor.h"
#include "transform/image.h"
#include "transform/targets.h"

namespace stoker::transform {

// Buffers reused from sample to sample on one thread.
struct RasterScratch {
  Image plane, scratch, coverage;
  std::vector<std::byte> moved;
};

// The bytes of `fill` as one element of `type`. InvalidArgument when the
// type cannot hold it: a fraction or a value out of range for an integer
// type, anything but 0 or 1 for bool. Floating types take any value (NaN
// too), rounded to their precision.
[[nodiscard]] Result<std::vector<std::byte>> FillBytes(ElementType type, double fill);

// Moves `raster` through the image's geometry in place. Its shape is
// [H, W], [H, W, C] (layout "HWC") or [C, H, W] ("CHW"), H x W the size the
// image was decoded at. Corruption, naming it as `what` ("mask", "array"),
// for another size or number of dimensions; InvalidArgument for a fill its
// element type cannot hold.
[[nodiscard]] Status FollowRaster(const SampleGeometry& g, std::string_view what, std::string_view layout, double fill,
                                  HostTensor& raster, RasterScratch& scratch);

}  // namespace stoker::transform
