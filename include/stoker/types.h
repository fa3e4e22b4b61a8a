// stoker/types.h: small vocabulary types shared across the public API.
#pragma once

#include <cstdint>

namespace stoker {

// Element type of image tensors.
enum class DType : std::uint8_t { kUint8, kFloat32, kFloat16, kBFloat16 };
// Memory layout of an image batch: channels first (PyTorch's default) or last.
enum class Layout : std::uint8_t { kNCHW, kNHWC };

}  // namespace stoker
