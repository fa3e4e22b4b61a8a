// TIFF decoding with libtiff, into the mode Pillow opens the file in (see
// pixels.h), the first image of the file: 1-, 2-, 4-, 8- and 16-bit
// grayscale (min-is-black and min-is-white), gray + alpha, 8- and 16-bit RGB
// and RGBA (unassociated alpha), palettes; in strips or tiles, contiguous or
// planar, with any compression the library has (none, LZW, Deflate,
// PackBits, JPEG, ZSTD, WebP, ...). Float, signed, 32-bit, CMYK and
// associated-alpha images are refused by name (Unimplemented), as a build
// without libtiff refuses every TIFF.
#pragma once

#include <cstdint>
#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"

namespace stoker::codec {

// Whether this build decodes TIFF (libtiff was found).
[[nodiscard]] bool TiffSupported();

// The first image's width and height. Corruption when it is not a TIFF.
[[nodiscard]] Result<ImageSize> TiffSize(std::span<const std::byte> tiff);

// Decodes the first image of `tiff`. Corruption (naming what is wrong) for
// a damaged or truncated file, or more than `max_pixels` pixels (checked
// before any pixel is decoded; 0: no limit).
[[nodiscard]] Status DecodeTiff(std::span<const std::byte> tiff, std::uint64_t max_pixels, SourceImage* out);

}  // namespace stoker::codec
