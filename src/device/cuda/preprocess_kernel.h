// The GPU preprocessing kernel's launcher (src/device/cuda/preprocess_kernel.cu).
// Plain C++: callers need no CUDA headers.
#pragma once

#include <cstdint>

#include "device/augment_math.h"
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

// Enqueues the augmentation kernels (device/augment_math.h) for `count`
// images: stage 1, one thread per output pixel, resizes into `staging`
// (count output-sized RGB images); stage 2, one block per image, runs the
// colour ops there and writes the output. Returns the cudaError_t of the
// launches (0: success).
int LaunchAugmentKernels(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                         const AugmentDesc* augments, std::int32_t count, const OutputDesc& output,
                         std::uint8_t* staging, void* out, std::uint64_t out_image_bytes, void* stream);

}  // namespace stoker::device
