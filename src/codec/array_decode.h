// What an Array field's bytes may be, told apart by their first bytes: a
// NumPy .npy (npy.h), a TIFF's samples as stored (tiff.h's
// DecodeTiffArray: multi-band, float, signed images no image mode holds) or
// a PNG's (png.h's DecodePngArray: 16-bit depth maps, label maps).
#pragma once

#include <cstdint>
#include <span>

#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

// `max_pixels` bounds a TIFF or PNG (0: no limit); an .npy is bounded by its size.
[[nodiscard]] Status DecodeArrayTensor(std::span<const std::byte> bytes, std::uint64_t max_pixels, HostTensor* out);

}  // namespace stoker::codec
