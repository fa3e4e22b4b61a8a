// The CPU twin of the GPU preprocessing kernel: the same operations and the
// same arithmetic (device/preprocess_math.h), run on the host. It is the
// reference the GPU tests compare against, and what runs where no GPU is.
#pragma once

#include <cstdint>
#include <span>

#include "device/preprocess_math.h"

namespace stoker::device {

// Writes image k's output at out + k * OutputImageBytes(output). `decoded`:
// the decode area, for images whose source is 1.
void PreprocessOnCpu(const std::uint8_t* pixels, std::span<const ImageDesc> images, const OutputDesc& output, void* out,
                     const std::uint8_t* decoded = nullptr);

}  // namespace stoker::device
