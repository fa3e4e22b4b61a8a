#include "codec/netpbm.h"

#include <cmath>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

struct Header {
  bool color = false;
  std::uint32_t width = 0, height = 0, maxval = 0;
  std::size_t raster_at = 0;  // the first sample byte
};

bool IsSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// The header: "P5" or "P6", then width, height and maxval as decimal
// numbers separated by whitespace and comments ('#' to the end of the line),
// then one whitespace byte before the raster.
Result<Header> ReadHeader(std::span<const std::byte> data) {
  const auto* b = reinterpret_cast<const unsigned char*>(data.data());
  if (!IsNetpbm(data)) {
    if (data.size() >= 2 && b[0] == 'P' && b[1] >= '1' && b[1] <= '4')
      return Status::Unimplemented(
          fmt::format("a Netpbm P{} image ({}): stoker decodes the binary PGM and PPM forms (P5, P6); convert it",
                      static_cast<char>(b[1]), b[1] == '4' ? "a binary PBM bitmap" : "a plain-text form"));
    return Status::Corruption("not a binary PGM or PPM: it does not start with P5 or P6");
  }
  Header header;
  header.color = b[1] == '6';
  std::size_t at = 2;
  std::uint32_t values[3];
  for (auto& value : values) {
    // Whitespace and comments, then digits.
    while (at < data.size() && (IsSpace(b[at]) || b[at] == '#')) {
      if (b[at] == '#') {
        while (at < data.size() && b[at] != '\n' && b[at] != '\r') ++at;
      } else {
        ++at;
      }
    }
    if (at >= data.size() || b[at] < '0' || b[at] > '9')
      return Status::Corruption(fmt::format("PGM/PPM header: no number at byte {}", at));
    std::uint64_t v = 0;
    while (at < data.size() && b[at] >= '0' && b[at] <= '9') {
      v = v * 10 + (b[at++] - '0');
      if (v > 0xFFFFFFFFu) return Status::Corruption("PGM/PPM header: a number too large");
    }
    value = static_cast<std::uint32_t>(v);
  }
  header.width = values[0];
  header.height = values[1];
  header.maxval = values[2];
  if (at >= data.size() || !IsSpace(b[at]))
    return Status::Corruption(fmt::format("PGM/PPM header: no whitespace after maxval at byte {}", at));
  header.raster_at = at + 1;
  if (header.width == 0 || header.height == 0 || header.width > 65535 || header.height > 65535)
    return Status::Corruption(fmt::format("PGM/PPM of {}x{} pixels", header.width, header.height));
  if (header.maxval == 0 || header.maxval > 65535)
    return Status::Corruption(fmt::format("PGM/PPM maxval {} (1 to 65535)", header.maxval));
  return header;
}

}  // namespace

bool IsNetpbm(std::span<const std::byte> data) {
  const auto* b = reinterpret_cast<const unsigned char*>(data.data());
  return data.size() >= 3 && b[0] == 'P' && (b[1] == '5' || b[1] == '6') && IsSpace(b[2]);
}

Result<ImageSize> NetpbmSize(std::span<const std::byte> data) {
  STOKER_ASSIGN_OR_RETURN(Header header, ReadHeader(data));
  return ImageSize{static_cast<int>(header.width), static_cast<int>(header.height)};
}

Status DecodeNetpbm(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out) {
  STOKER_ASSIGN_OR_RETURN(Header header, ReadHeader(data));
  STOKER_RETURN_IF_ERROR(CheckPixelLimit("PGM/PPM", header.width, header.height, max_pixels));
  const std::uint64_t pixels = std::uint64_t{header.width} * header.height;
  const int channels = header.color ? 3 : 1;
  const int sample_bytes = header.maxval > 255 ? 2 : 1;
  const std::uint64_t samples = pixels * channels;
  const std::uint64_t raster = samples * sample_bytes;
  if (data.size() - header.raster_at < raster)
    return Status::Corruption(fmt::format("truncated PGM/PPM: {}x{} needs {} raster bytes, {} are there", header.width,
                                          header.height, raster, data.size() - header.raster_at));
  // Pillow keeps P5 over 8 bits as "I" (0..65535); everything else is 8 bits.
  const bool gray16 = !header.color && sample_bytes == 2;
  const double top = gray16 ? 65535.0 : 255.0;
  out->mode = header.color ? SourceMode::kRGB : (gray16 ? SourceMode::kGray16 : SourceMode::kGray);
  out->width = static_cast<int>(header.width);
  out->height = static_cast<int>(header.height);
  out->transparency = {};
  out->format = header.color ? "PPM" : "PGM";
  out->data.resize(samples * (gray16 ? 2 : 1));
  const auto* in = reinterpret_cast<const unsigned char*>(data.data()) + header.raster_at;
  if (header.maxval == 255) {
    std::copy(in, in + samples, out->data.begin());
    return Status::Ok();
  }
  // round(value / maxval * top), ties to even, as Python's round() on the double Pillow computes.
  for (std::uint64_t i = 0; i < samples; ++i) {
    std::uint32_t v = sample_bytes == 2 ? (std::uint32_t{in[2 * i]} << 8) | in[2 * i + 1] : in[i];
    if (v > header.maxval) v = header.maxval;
    const auto scaled = static_cast<std::uint16_t>(std::nearbyint(static_cast<double>(v) / header.maxval * top));
    if (gray16)
      std::memcpy(out->data.data() + 2 * i, &scaled, 2);  // host-endian, as kGray16 is
    else
      out->data[i] = static_cast<std::uint8_t>(scaled);
  }
  return Status::Ok();
}

}  // namespace stoker::codec
