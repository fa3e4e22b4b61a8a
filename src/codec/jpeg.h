// JPEG decoding with libjpeg-turbo: whole images, or only a region of
// interest (skipping the rows above and below it and cropping columns to the
// nearest iMCU), optionally with DCT-domain downscaling by 2, 4 or 8.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::codec {

struct ImageSize {
  int width = 0;
  int height = 0;
};

// Reads the JPEG header only. Another image format (PNG, WebP, GIF, BMP,
// TIFF, PGM/PPM), recognised by its magic bytes, is Unimplemented naming it;
// anything else that is not a JPEG is Corruption.
// Whether a sample's field `field` (its WebDataset extension) holds a JPEG
// that pack may re-write and the index may give a restart table: `jpg` or
// `jpeg`.
[[nodiscard]] inline bool IsJpegField(std::string_view field) {
  return field == "jpg" || field == "jpeg";
}

[[nodiscard]] Result<ImageSize> JpegSize(std::span<const std::byte> jpeg);
// "PNG", "WebP", ... when `data` starts like an image of another format.
[[nodiscard]] std::optional<std::string_view> OtherImageFormat(std::span<const std::byte> data);

// A decoded RGB region: `pixels` holds height rows of width * 3 bytes. It
// covers, in full-resolution coordinates, the box starting at (origin_x,
// origin_y), each decoded pixel standing for `scale` x `scale` source pixels.
struct DecodedRegion {
  std::vector<std::uint8_t> pixels;
  int width = 0;
  int height = 0;
  int origin_x = 0;
  int origin_y = 0;
  int scale = 1;  // 1, 2, 4 or 8
  ImageSize full;
};

struct Roi {
  int x = 0, y = 0, width = 0, height = 0;  // in full-resolution pixels; width 0 = whole image
};

// Decodes `roi` (or the whole image) to RGB at 1/scale resolution. Grey and
// CMYK images are converted to RGB. The decoded region may be slightly larger
// than asked (iMCU alignment); it always contains the requested box, mapped
// to scaled coordinates. Errors (a corrupt or truncated JPEG, or not a JPEG)
// return Corruption; never crashes on malformed input.
// `out` is reused to avoid allocations.
[[nodiscard]] Status DecodeJpeg(std::span<const std::byte> jpeg, Roi roi, int scale, DecodedRegion& out);

// Encodes RGB pixels (`height` rows of width * 3 bytes) as a baseline JPEG:
// YCbCr 4:2:0, libjpeg's standard tables scaled to `quality` (1-100), the
// accurate integer DCT, Huffman tables optimised, no metadata (a JFIF
// header only). The same pixels give the same bytes.
[[nodiscard]] Result<std::vector<std::byte>> EncodeJpegRgb(const std::uint8_t* rgb, int width, int height, int quality);

}  // namespace stoker::codec
