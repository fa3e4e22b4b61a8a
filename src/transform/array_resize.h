// Resize for arrays (a stoker.Array field's transform: Resize(size,
// interpolation)), as torchvision resizes a tensor: any element type and
// band count, HWC or CHW.
//
//   nearest   torch's nearest rule (source index floor(dst * in / out), the
//             scale in float32), values copied as they are;
//   bilinear  with antialiasing (torchvision.transforms.v2's default, and
//             what Pillow's resize does to images): separable triangle
//             filters as torch's _upsample_bilinear2d_aa, width first, in
//             float32 (float64 for float64 arrays); integer types rounded
//             half to even and cast back, float16 converted back, as
//             torchvision's tensor resize does. Upsampling is plain
//             bilinear (align_corners=False).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/tensor.h"
#include "transform/array_geometry.h"

namespace stoker::transform {

// torchvision's output size for Resize(size): one value resizes the shorter
// side to it, keeping the aspect (the longer side truncated, as
// int(size * long / short)); two are (height, width).
[[nodiscard]] std::pair<std::int64_t, std::int64_t> ArrayResizeSize(const std::vector<double>& size,
                                                                    std::int64_t height, std::int64_t width);

// Resizes `t` (laid out as `g` says) to height x width in place; `scratch`
// is reused. InvalidArgument for bilinear on a bool array.
[[nodiscard]] Status ResizeArray(HostTensor& t, ArrayGeometry& g, std::int64_t height, std::int64_t width,
                                 bool bilinear, std::vector<std::byte>& scratch);

}  // namespace stoker::transform
