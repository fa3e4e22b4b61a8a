// The GPU preprocessing kernel's launcher (src/device/cuda/preprocess_kernel.cu).
// Plain C++: callers need no CUDA headers.
#pragma once

#include <cstdint>

#include "device/preprocess_math.h"

namespace stoker::device {

// Enqueues the fused crop + resize + flip + normalise + layout + dtype pass
// for `count` images on `stream` (a cudaStream_t). `pixels` and `images`
// are device pointers; image k's output starts at out + k * out_image_bytes.
// `decoded`: the GPU decoder's output area (images with source 1), or null.
// Returns the cudaError_t of the launch (0: success).
int LaunchPreprocessKernel(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                           std::int32_t count, const OutputDesc& output, void* out, std::uint64_t out_image_bytes,
                           void* stream);

}  // namespace stoker::device
