// What an Array field's bytes may be, told apart by their first bytes: a
// NumPy .npy (npy.h) or a TIFF's samples as stored (tiff.h's
// DecodeTiffArray: multi-band, float, signed images no image mode holds).
#pragma once

#include <cstdint>
#include <span>

#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

// `max_pixels` bounds a TIFF (0: no limit); an .npy is bounded by its size.
[[nodiscard]] Status DecodeArrayTensor(std::span<const std::byte> bytes, std::uint64_t max_pixels, HostTensor* out);

}  // namespace stoker::codec
