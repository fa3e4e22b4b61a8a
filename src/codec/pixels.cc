#include "codec/pixels.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

// Pillow's rgb2l (Convert.c): 16.16 fixed-point ITU-R 601-2 luma.
inline std::uint8_t Luma(const std::uint8_t* rgb) {
  return static_cast<std::uint8_t>((rgb[0] * 19595u + rgb[1] * 38470u + rgb[2] * 7471u + 0x8000u) >> 16);
}

inline std::uint16_t Sample16(const std::uint8_t* data, std::size_t i) {
  std::uint16_t v = 0;
  std::memcpy(&v, data + 2 * i, 2);
  return v;
}

inline std::uint8_t Clip8(std::uint16_t v) {
  return static_cast<std::uint8_t>(std::min<std::uint16_t>(v, 255));
}

}  // namespace

std::optional<ColorMode> ParseColorMode(std::string_view name) {
  if (name == "RGB") return ColorMode::kRGB;
  if (name == "L") return ColorMode::kL;
  if (name == "RGBA") return ColorMode::kRGBA;
  if (name == "I;16") return ColorMode::kI16;
  return std::nullopt;
}

Status UnknownColorMode(std::string_view name) {
  return Status::InvalidArgument(fmt::format("image mode '{}': RGB, L, RGBA or I;16", name));
}

std::string_view ColorModeName(ColorMode mode) {
  switch (mode) {
    case ColorMode::kRGB:
      return "RGB";
    case ColorMode::kL:
      return "L";
    case ColorMode::kRGBA:
      return "RGBA";
    case ColorMode::kI16:
      return "I;16";
  }
  return "?";
}

int ColorModeChannels(ColorMode mode) {
  switch (mode) {
    case ColorMode::kRGB:
      return 3;
    case ColorMode::kRGBA:
      return 4;
    case ColorMode::kL:
    case ColorMode::kI16:
      return 1;
  }
  return 0;
}

int ColorModeBytesPerChannel(ColorMode mode) {
  return mode == ColorMode::kI16 ? 2 : 1;
}

int SourceChannels(SourceMode mode) {
  switch (mode) {
    case SourceMode::kGray:
    case SourceMode::kGray16:
      return 1;
    case SourceMode::kGrayAlpha:
      return 2;
    case SourceMode::kRGB:
      return 3;
    case SourceMode::kRGBA:
      return 4;
  }
  return 0;
}

std::string_view SourceModeName(SourceMode mode) {
  switch (mode) {
    case SourceMode::kGray:
      return "L";
    case SourceMode::kGrayAlpha:
      return "LA";
    case SourceMode::kRGB:
      return "RGB";
    case SourceMode::kRGBA:
      return "RGBA";
    case SourceMode::kGray16:
      return "I";
  }
  return "?";
}

Status CheckPixelLimit(std::string_view format, std::uint64_t width, std::uint64_t height, std::uint64_t max_pixels) {
  const std::uint64_t pixels = width * height;
  if (max_pixels != 0 && pixels > max_pixels)
    return Status::Corruption(fmt::format(
        "{} of {}x{} = {} pixels is over the limit of {} (a decompression bomb?); max_image_pixels raises it", format,
        width, height, pixels, max_pixels));
  return Status::Ok();
}

Status ConvertToMode(const SourceImage& image, ColorMode mode, Pixels* out) {
  const std::size_t n = static_cast<std::size_t>(image.width) * static_cast<std::size_t>(image.height);
  const int in_channels = SourceChannels(image.mode);
  const std::size_t in_bytes = n * static_cast<std::size_t>(in_channels) * (image.mode == SourceMode::kGray16 ? 2 : 1);
  if (image.data.size() != in_bytes)
    return Status::Internal(
        fmt::format("a decoded {} image holds {} bytes, not {}", image.format, image.data.size(), in_bytes));
  out->width = image.width;
  out->height = image.height;
  out->channels = ColorModeChannels(mode);
  out->bytes_per_channel = ColorModeBytesPerChannel(mode);
  const std::uint8_t* in = image.data.data();

  if (mode == ColorMode::kI16) {
    if (image.mode != SourceMode::kGray && image.mode != SourceMode::kGray16)
      return Status::InvalidArgument(fmt::format("mode I;16 takes grayscale images; this {} image is {}", image.format,
                                                 SourceModeName(image.mode)));
    out->data.resize(n * 2);
    if (image.mode == SourceMode::kGray16) {
      std::memcpy(out->data.data(), in, n * 2);
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t v = in[i];
        std::memcpy(out->data.data() + 2 * i, &v, 2);
      }
    }
    return Status::Ok();
  }

  // Same layout: nothing to convert.
  if ((mode == ColorMode::kRGB && image.mode == SourceMode::kRGB) ||
      (mode == ColorMode::kL && image.mode == SourceMode::kGray) ||
      (mode == ColorMode::kRGBA && image.mode == SourceMode::kRGBA)) {
    out->data = image.data;
    return Status::Ok();
  }

  out->data.resize(n * static_cast<std::size_t>(out->channels));
  std::uint8_t* o = out->data.data();
  const Transparency& t = image.transparency;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint8_t r = 0, g = 0, b = 0, a = 255, l = 0;
    bool transparent = false;
    switch (image.mode) {
      case SourceMode::kGray:
        l = r = g = b = in[i];
        transparent = t.gray && in[i] == t.value;
        break;
      case SourceMode::kGray16: {
        const std::uint16_t v = Sample16(in, i);
        l = r = g = b = Clip8(v);
        transparent = t.gray && v == t.value;
        break;
      }
      case SourceMode::kGrayAlpha:
        l = r = g = b = in[2 * i];
        a = in[2 * i + 1];
        break;
      case SourceMode::kRGB:
        r = in[3 * i], g = in[3 * i + 1], b = in[3 * i + 2];
        l = Luma(in + 3 * i);
        transparent = t.rgb && r == t.red && g == t.green && b == t.blue;
        break;
      case SourceMode::kRGBA:
        r = in[4 * i], g = in[4 * i + 1], b = in[4 * i + 2], a = in[4 * i + 3];
        l = Luma(in + 4 * i);
        break;
    }
    switch (mode) {
      case ColorMode::kRGB:
        o[3 * i] = r, o[3 * i + 1] = g, o[3 * i + 2] = b;
        break;
      case ColorMode::kL:
        o[i] = l;
        break;
      case ColorMode::kRGBA:
        o[4 * i] = r, o[4 * i + 1] = g, o[4 * i + 2] = b, o[4 * i + 3] = transparent ? 0 : a;
        break;
      case ColorMode::kI16:
        break;  // handled above
    }
  }
  return Status::Ok();
}

}  // namespace stoker::codec
