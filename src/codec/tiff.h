// TIFF decoding with libtiff. As an image (DecodeTiff), into the mode
// Pillow opens the file in (see pixels.h), the first image of the file: 1-, 2-, 4-, 8- and 16-bit
// grayscale (min-is-black and min-is-white), gray + alpha, 8- and 16-bit RGB
// and RGBA (unassociated alpha), palettes; in strips or tiles, contiguous or
// planar, with any compression the library has (none, LZW, Deflate,
// PackBits, JPEG, ZSTD, WebP, ...). Float, signed, 32-bit, CMYK and
// associated-alpha images are refused by name (Unimplemented), as a build
// without libtiff refuses every TIFF. As an array (DecodeTiffArray), the
// samples as stored, any count and type: multi-band, float, signed.
#pragma once

#include <cstdint>
#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

// Whether this build decodes TIFF (libtiff was found).
[[nodiscard]] bool TiffSupported();

// The first image's width and height. Corruption when it is not a TIFF.
[[nodiscard]] Result<ImageSize> TiffSize(std::span<const std::byte> tiff);

// Decodes the first image of `tiff`. Corruption (naming what is wrong) for
// a damaged or truncated file, or more than `max_pixels` pixels (checked
// before any pixel is decoded; 0: no limit).
[[nodiscard]] Status DecodeTiff(std::span<const std::byte> tiff, std::uint64_t max_pixels, SourceImage* out);

// Decodes `tiff`'s samples as stored, as tifffile.imread gives them: 8- to
// 64-bit unsigned, signed or floating-point samples, any number a pixel
// (multi-band satellite images, float elevation or depth maps, 16-bit
// medical scans), in strips or tiles, contiguous or planar, with any
// compression and predictor libtiff has. No colour is interpreted: palette
// images give their indices, min-is-white its values, and JPEG-compressed
// YCbCr is handed over as RGB by libtiff. Shape (H, W) for one sample a
// pixel, (H, W, S) contiguous, (S, H, W) planar; a file of several
// full-resolution pages of one shape and type stacks them (P, ...), while
// reduced-resolution pages (overviews) and masks are skipped. The pixels
// over all pages may be at most `max_pixels` (0: no limit), and the decoded
// bytes at most 4 x max_pixels; both are checked before any sample is
// decoded. Corruption for a damaged file or pages that differ;
// Unimplemented, by name, for 1- to 4-bit, 24-bit, complex or untyped
// samples and subsampled YCbCr.
[[nodiscard]] Status DecodeTiffArray(std::span<const std::byte> tiff, std::uint64_t max_pixels, HostTensor* out);

}  // namespace stoker::codec
