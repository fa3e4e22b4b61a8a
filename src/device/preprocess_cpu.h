// The CPU twin of the GPU preprocessing kernel: the same operations and the
// same arithmetic (device/preprocess_math.h), run on the host. It is the
// reference the GPU tests compare against, and what runs where no GPU is.
#pragma once

#include <cstdint>
#include <span>

#include "device/augment_math.h"
#include "device/preprocess_math.h"

namespace stoker::device {

// Writes image k's output at out + k * OutputImageBytes(output). `decoded`:
// the decode area, for images whose source is 1.
void PreprocessOnCpu(const std::uint8_t* pixels, std::span<const ImageDesc> images, const OutputDesc& output, void* out,
                     const std::uint8_t* decoded = nullptr);

// The augmentation kernels' twin (device/augment_math.h): stage 1 resizes
// each image (through its warps) into `staging` (an output-sized RGB image
// per image), stage 2 runs its colour ops there and writes the output.
void AugmentOnCpu(const std::uint8_t* pixels, std::span<const ImageDesc> images, const AugmentDesc* augments,
                  const OutputDesc& output, std::uint8_t* staging, void* out, const std::uint8_t* decoded = nullptr);

}  // namespace stoker::device
