// Binary PGM and PPM images (Netpbm's P5 and P6; GTSRB and other older
// datasets ship them), decoded as Pillow opens them: P5 as "L" (maxval up
// to 255) or "I" (16-bit, up to 65535), P6 as "RGB", samples scaled to the
// mode's range as Pillow's PpmDecoder does (round(value / maxval * top),
// values over maxval clipped). The plain (ASCII) forms and PBM bitmaps
// (P1-P4) are refused, naming them.
#pragma once

#include <span>

#include "codec/jpeg.h"
#include "codec/pixels.h"
#include "stoker/status.h"

namespace stoker::codec {

// Whether `data` starts as a binary PGM or PPM ("P5" or "P6", then whitespace).
[[nodiscard]] bool IsNetpbm(std::span<const std::byte> data);

// Width and height from the header; Corruption naming what is wrong with it.
[[nodiscard]] Result<ImageSize> NetpbmSize(std::span<const std::byte> data);

// Decodes the image; Corruption for a malformed header or a raster shorter
// than the header says, and for more than `max_pixels` pixels (0: any).
[[nodiscard]] Status DecodeNetpbm(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out);

}  // namespace stoker::codec
