// PNG decoding with libspng, into the mode Pillow opens the file in (see
// pixels.h): every color type and bit depth, palettes (tRNS as alpha),
// interlaced images; CRCs of every chunk checked.
#pragma once

#include <cstdint>
#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"

namespace stoker::codec {

// The header only: width and height. Corruption when it is not a PNG.
[[nodiscard]] Result<ImageSize> PngSize(std::span<const std::byte> png);

// Decodes `png`. Corruption (naming what is wrong) for a damaged file, a bad
// CRC, a truncated image, or more than `max_pixels` pixels (checked before
// any pixel is decoded; 0: no limit).
[[nodiscard]] Status DecodePng(std::span<const std::byte> png, std::uint64_t max_pixels, SourceImage* out);

}  // namespace stoker::codec
