// Windows BMP images (torchvision's ImageFolder lists .bmp, and older
// datasets ship them), decoded as Pillow's BmpImagePlugin opens them (its
// rules read from Pillow 9.4's source; pixels checked against 9.4 and 13):
//   - headers of 12 (OS/2 1.x), 40, 64, 108 and 124 bytes; bottom-up or
//     top-down (a negative height);
//   - 1-, 4- and 8-bit palettes ("RGB" pixels; a palette of only greys, as
//     Pillow's check finds it, gives "L"; an index past the palette is
//     black, as in Pillow 13 (Pillow 9.4: grey i), or in a palette of greys
//     its own value);
//   - 16-bit 5-5-5 and 5-6-5 (each field scaled by v * 255 / max, as
//     Pillow's unpackers do), 24-bit, and 32-bit with the bitfield layouts
//     Pillow knows (alpha kept where the masks name one, "RGBA");
//   - 8- and 4-bit run-length compression (RLE8, RLE4) as Pillow 13's
//     BmpRleDecoder reads it (Pillow 9.4 misreads a delta's offsets and an
//     odd RLE4 absolute run: bmp.cc).
// Refused with Unimplemented, naming what: other bit depths and bitfield
// layouts, JPEG or PNG inside a BMP, and headers of other sizes. A raster
// shorter than the header says (rows of ((width * bits + 31) / 32) * 4
// bytes), or run-length data that ends before the image is full, is
// Corruption. Where Pillow reads a "grey" palette with another bit depth
// than the data's (a 2-colour black-and-white palette on 8-bit data), this
// reads the pixels through the palette, which Pillow does not.
#pragma once

#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"

namespace stoker::codec {

// Whether `data` starts as a BMP file ("BM").
[[nodiscard]] bool IsBmp(std::span<const std::byte> data);

// Width and height from the header; Corruption or Unimplemented naming what
// is wrong with it.
[[nodiscard]] Result<ImageSize> BmpSize(std::span<const std::byte> data);

// Decodes the image; errors as above, and Corruption for more than
// `max_pixels` pixels (0: any).
[[nodiscard]] Status DecodeBmp(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out);

}  // namespace stoker::codec
