// Augmentation for arrays (a stoker.Array field's transform): the steps
// that mean the same on any number of bands and any element type, applied
// to one sample's [H, W], [H, W, C] or [C, H, W] array on a loader thread.
//
//   RandomCrop            size (1 or 2: height, width); no padding
//   CenterCrop            size; the array must be at least that large
//   Resize                size (1: the shorter side; 2: height, width),
//                         interpolation nearest or bilinear (antialiased;
//                         transform/array_resize.h)
//   RandomHorizontalFlip  p
//   RandomVerticalFlip    p
//   Normalize             mean, std (1 value, or one a band): to float32,
//                         (x - mean) / std a band
//
// Draws come from the Rng given, in step order, so two arrays of one size
// given the same steps and one sample's Rng get the same crop and flips
// (bands and their label map stay aligned).
#pragma once

#include <string_view>
#include <vector>

#include "core/rng.h"
#include "stoker/augment.h"
#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::transform {

// "HWC" (a 2-D array is [H, W]) or "CHW": where the height and width are.
[[nodiscard]] bool KnownArrayLayout(std::string_view layout);

// InvalidArgument naming the first step it does not take (a step of
// another name, an unknown argument, padding) or whose arguments are out
// of range.
[[nodiscard]] Status CheckArrayTransform(const std::vector<TransformStep>& steps, std::string_view layout);

// Applies `steps` (checked) to `array` in place; `scratch` is reused
// between calls. InvalidArgument, naming the shape, for an array that is
// not 2-D or 3-D, smaller than a crop, or with another number of bands
// than Normalize's mean and std.
[[nodiscard]] Status ApplyArrayTransform(const std::vector<TransformStep>& steps, std::string_view layout, Rng& rng,
                                         HostTensor& array, std::vector<std::byte>& scratch);

}  // namespace stoker::transform
