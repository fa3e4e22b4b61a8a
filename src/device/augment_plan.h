// From a sample's drawn steps to the augmentation kernels' AugmentDesc
// (device/augment_math.h): which warps the kernel evaluates per pixel, and
// the colour ops, flips and erasures.
#pragma once

#include <span>

#include "device/augment_math.h"
#include "stoker/status.h"
#include "transform/pixel_ops.h"
#include "transform/step.h"

namespace stoker::device {

// The warps before the crop (each with the size of its input, then the
// last one's output: sizes has one more entry) as kernel stages in
// `augment` (warp_count; identities are left out). False when the kernel
// does not evaluate them per pixel as Pillow's engines do: a nearest warp
// that takes Pillow's scale engine (unless a transpose) or its
// floating-point engine, more than one bilinear warp, more than
// kMaxWarpStages warps.
[[nodiscard]] bool KernelWarps(std::span<const transform::Step::PartWarp> warps, std::span<const transform::Size> sizes,
                               AugmentDesc& augment);

// The drawn program (after the crop and on the tensor) and the crop
// stage's flip, into `augment`'s ops, flips and erasures. InvalidArgument
// past kMaxPixelOps colour ops or kMaxErases erasures.
[[nodiscard]] Status DescribeProgram(const transform::PixelProgram& program, bool flip, AugmentDesc& augment);

}  // namespace stoker::device
