// PNG decoding with libspng, into the mode Pillow opens the file in (see
// pixels.h): every color type and bit depth, palettes (tRNS as alpha),
// interlaced images; CRCs of every chunk checked.
#pragma once

#include <cstdint>
#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

// The header only: width and height. Corruption when it is not a PNG.
[[nodiscard]] Result<ImageSize> PngSize(std::span<const std::byte> png);

// Decodes `png`. Corruption (naming what is wrong) for a damaged file, a bad
// CRC, a truncated image, or more than `max_pixels` pixels (checked before
// any pixel is decoded; 0: no limit).
[[nodiscard]] Status DecodePng(std::span<const std::byte> png, std::uint64_t max_pixels, SourceImage* out);

// Decodes `png`'s samples as stored, for an Array field (a 16-bit depth
// map, a label map): no colour interpreted, no scaling. Gray [H, W];
// gray + alpha, RGB, RGBA [H, W, 2|3|4]; uint16 at 16 bits, uint8 below;
// 1-, 2- and 4-bit samples as their values (0..2^depth - 1, not scaled to
// 255 as Pillow's "L"); a palette image gives its indices [H, W] (as
// NumPy gives a Pillow "P" image). tRNS is no sample and is left out.
// Errors as DecodePng's.
[[nodiscard]] Status DecodePngArray(std::span<const std::byte> png, std::uint64_t max_pixels, HostTensor* out);

}  // namespace stoker::codec
