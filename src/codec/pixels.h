// Decoded images as their codec gives them, and their conversion to the
// pixel layout a user asks for, with Pillow's rules: a field decoded here
// has exactly the pixels of `PIL.Image.open(f).convert(mode)`.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::codec {

// What a user asks for, by Pillow's mode names.
enum class ColorMode : std::uint8_t {
  kRGB,   // "RGB": 3 x uint8
  kL,     // "L": 1 x uint8, ITU-R 601-2 luma of colour images
  kRGBA,  // "RGBA": 4 x uint8, 255 where the image has no alpha
  kI16,   // "I;16": 1 x uint16 (grayscale images only), 16-bit PNGs kept whole
};
[[nodiscard]] std::optional<ColorMode> ParseColorMode(std::string_view name);
// InvalidArgument naming `name` and the modes there are.
[[nodiscard]] Status UnknownColorMode(std::string_view name);
[[nodiscard]] std::string_view ColorModeName(ColorMode mode);
[[nodiscard]] int ColorModeChannels(ColorMode mode);
[[nodiscard]] int ColorModeBytesPerChannel(ColorMode mode);

// A decoded image in the mode Pillow opens it in. kGray16 samples are
// host-endian uint16 (Pillow's "I"); everything else is 8 bits a channel
// (16-bit colour PNGs keep the high byte, as Pillow does). A palette image
// arrives expanded to RGBA (its tRNS entries as alpha).
enum class SourceMode : std::uint8_t { kGray, kGrayAlpha, kRGB, kRGBA, kGray16 };

// PNG's tRNS for images without an alpha channel: the colour that is fully
// transparent, as stored (Pillow compares it, unscaled, to the pixels).
struct Transparency {
  bool gray = false, rgb = false;
  std::uint32_t value = 0;  // gray
  std::uint32_t red = 0, green = 0, blue = 0;
};

struct SourceImage {
  SourceMode mode = SourceMode::kRGB;
  int width = 0, height = 0;
  std::vector<std::uint8_t> data;  // rows of width * channels samples, no padding
  Transparency transparency;
  std::string_view format;  // "PNG", "WebP", "JPEG"
};
[[nodiscard]] int SourceChannels(SourceMode mode);
[[nodiscard]] std::string_view SourceModeName(SourceMode mode);  // Pillow's: "L", "LA", "RGB", "RGBA", "I"

// Pixels ready for a batch: height rows of width * channels samples of
// `bytes_per_channel` bytes (host-endian), HWC.
struct Pixels {
  int width = 0, height = 0, channels = 0, bytes_per_channel = 1;
  std::vector<std::uint8_t> data;
};

// Corruption naming `format` and the size when width x height is over
// `max_pixels` (0: any), as Pillow's DecompressionBombError: every codec
// checks its header's size with it before decoding.
[[nodiscard]] Status CheckPixelLimit(std::string_view format, std::uint64_t width, std::uint64_t height,
                                     std::uint64_t max_pixels);

// `image` converted to `mode` as Pillow's Image.convert does (RGB <-> L by
// L = (19595 R + 38470 G + 7471 B + 32768) >> 16, 16-bit gray clipped to
// 0..255 for 8-bit modes, alpha dropped for RGB and L, tRNS as alpha for
// RGBA). InvalidArgument for I;16 of a colour image.
[[nodiscard]] Status ConvertToMode(const SourceImage& image, ColorMode mode, Pixels* out);

}  // namespace stoker::codec
