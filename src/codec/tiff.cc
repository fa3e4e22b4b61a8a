#include "codec/tiff.h"

#include "codec/tiff_reader.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace stoker::codec {

using tiff_internal::Damaged;
using tiff_internal::Open;
using tiff_internal::ReadRaw;
using tiff_internal::Source;
using tiff_internal::Tag;
using tiff_internal::TiffHandle;

bool TiffSupported() {
  return true;
}

Result<ImageSize> TiffSize(std::span<const std::byte> tiff) {
  Source source{tiff, 0, {}};
  STOKER_ASSIGN_OR_RETURN(TiffHandle tif, Open(source, tmsize_t{256} << 20));  // the header only
  const auto width = Tag<std::uint32_t>(tif.get(), TIFFTAG_IMAGEWIDTH, 0);
  const auto height = Tag<std::uint32_t>(tif.get(), TIFFTAG_IMAGELENGTH, 0);
  if (width == 0 || height == 0 || width > INT32_MAX || height > INT32_MAX)
    return Damaged(source, fmt::format("a size of {}x{}", width, height));
  return ImageSize{static_cast<int>(width), static_cast<int>(height)};
}

Status DecodeTiff(std::span<const std::byte> tiff, std::uint64_t max_pixels, SourceImage* out) {
  Source source{tiff, 0, {}};
  // A strip or tile of the largest image allowed, 16-bit RGBA, is the most any buffer needs.
  const auto max_alloc = static_cast<tmsize_t>(max_pixels == 0 ? std::uint64_t{1} << 40
                                                               : std::max<std::uint64_t>(64 << 20, max_pixels * 8));
  STOKER_ASSIGN_OR_RETURN(TiffHandle handle, Open(source, max_alloc));
  TIFF* tif = handle.get();
  const auto width = Tag<std::uint32_t>(tif, TIFFTAG_IMAGEWIDTH, 0);
  const auto height = Tag<std::uint32_t>(tif, TIFFTAG_IMAGELENGTH, 0);
  if (width == 0 || height == 0 || width > INT32_MAX || height > INT32_MAX)
    return Damaged(source, fmt::format("a size of {}x{}", width, height));
  STOKER_RETURN_IF_ERROR(CheckPixelLimit("TIFF", width, height, max_pixels));
  const auto bits = Tag<std::uint16_t>(tif, TIFFTAG_BITSPERSAMPLE, 1);
  const auto spp = Tag<std::uint16_t>(tif, TIFFTAG_SAMPLESPERPIXEL, 1);
  const auto format = Tag<std::uint16_t>(tif, TIFFTAG_SAMPLEFORMAT, SAMPLEFORMAT_UINT);
  const auto planar = Tag<std::uint16_t>(tif, TIFFTAG_PLANARCONFIG, PLANARCONFIG_CONTIG);
  std::uint16_t photometric = 0;
  if (TIFFGetField(tif, TIFFTAG_PHOTOMETRIC, &photometric) != 1)
    photometric = spp >= 3 ? PHOTOMETRIC_RGB : PHOTOMETRIC_MINISBLACK;
  const auto compression = Tag<std::uint16_t>(tif, TIFFTAG_COMPRESSION, COMPRESSION_NONE);
  std::uint16_t extra_count = 0;
  std::uint16_t* extra = nullptr;
  TIFFGetFieldDefaulted(tif, TIFFTAG_EXTRASAMPLES, &extra_count, &extra);
  const bool associated_alpha = extra_count > 0 && extra != nullptr && extra[0] == EXTRASAMPLE_ASSOCALPHA;

  auto refuse = [&](std::string_view what) {
    return Status::Unimplemented(
        fmt::format("TIFF: {}; stoker.Image decodes 1- to 16-bit grayscale, 8- and 16-bit RGB(A) and palette TIFFs "
                    "(stoker.Array(key=...) reads a TIFF's samples as stored: multi-band, float, signed)",
                    what));
  };
  if (format != SAMPLEFORMAT_UINT)
    return refuse(fmt::format("{}-bit {} samples", bits, tiff_internal::SampleFormatName(format)));
  if (photometric == PHOTOMETRIC_YCBCR && compression == COMPRESSION_JPEG) {
    // As Pillow has libtiff do: the JPEG codec hands over RGB.
    TIFFSetField(tif, TIFFTAG_JPEGCOLORMODE, JPEGCOLORMODE_RGB);
    photometric = PHOTOMETRIC_RGB;
  }
  const bool gray = photometric == PHOTOMETRIC_MINISBLACK || photometric == PHOTOMETRIC_MINISWHITE;
  const bool palette = photometric == PHOTOMETRIC_PALETTE;
  const bool rgb = photometric == PHOTOMETRIC_RGB;
  if (!gray && !palette && !rgb)
    return refuse(photometric == PHOTOMETRIC_SEPARATED ? std::string("a CMYK (separated) image")
                                                       : fmt::format("photometric interpretation {}", photometric));
  if (associated_alpha) return refuse("associated (premultiplied) alpha");
  const int channels = gray ? std::min<int>(spp, 2) : palette ? 1 : std::min<int>(spp, 4);
  // Pillow has no RGB mode past 6 samples (RGBXXX); more would only multiply what is allocated for the samples.
  if ((gray && spp > 2) || (palette && spp != 1) || (rgb && (spp < 3 || spp > 6)))
    return refuse(fmt::format("{} samples a pixel for photometric interpretation {}", spp, photometric));
  const bool sub_byte = bits < 8;
  if (!(bits == 8 || bits == 16 || (sub_byte && (bits == 1 || bits == 2 || bits == 4) && spp == 1 && !rgb)))
    return refuse(fmt::format("{}-bit samples ({} a pixel)", bits, spp));
  if (palette && bits == 16) return refuse("a 16-bit palette");

  const std::uint16_t planes = planar == PLANARCONFIG_SEPARATE && spp > 1 ? spp : 1;
  const std::size_t samples_a_row = std::size_t{width} * (planes == 1 ? spp : 1);
  const std::size_t row_bytes = (samples_a_row * bits + 7) / 8;
  out->width = static_cast<int>(width);
  out->height = static_cast<int>(height);
  out->transparency = {};
  out->format = "TIFF";
  const std::size_t pixel_bits = std::size_t{bits} * (planes == 1 ? spp : 1);
  // Samples stored as the mode holds them (8-bit gray, RGB, RGBA, gray +
  // alpha contiguous; 16-bit gray): decoded straight into the image.
  if (planes == 1 && !palette &&
      ((bits == 8 && channels == spp && photometric != PHOTOMETRIC_MINISWHITE) ||
       (bits == 16 && gray && channels == 1))) {
    out->data.resize(row_bytes * height);
    STOKER_RETURN_IF_ERROR(ReadRaw(tif, source, width, height, 1, row_bytes, pixel_bits, out->data.data()));
    out->mode = bits == 16      ? SourceMode::kGray16
                : channels == 1 ? SourceMode::kGray
                : channels == 2 ? SourceMode::kGrayAlpha
                : channels == 3 ? SourceMode::kRGB
                                : SourceMode::kRGBA;
    return Status::Ok();
  }
  std::vector<std::uint8_t> raw(row_bytes * height * planes);
  STOKER_RETURN_IF_ERROR(ReadRaw(tif, source, width, height, planes, row_bytes, pixel_bits, raw.data()));

  // The sample of pixel (x, y), channel c, as stored (8 or 16 bits).
  const std::size_t bytes_per_sample = bits == 16 ? 2 : 1;
  auto sample = [&](std::size_t x, std::size_t y, std::size_t c) -> std::uint32_t {
    const std::uint8_t* at = planes == 1 ? raw.data() + y * row_bytes + (x * spp + c) * bytes_per_sample
                                         : raw.data() + (c * height + y) * row_bytes + x * bytes_per_sample;
    if (bytes_per_sample == 2) {
      std::uint16_t v;  // libtiff hands samples over in host order
      std::memcpy(&v, at, 2);
      return v;
    }
    return *at;
  };

  if (sub_byte || palette) {
    // One packed index or level a pixel (Pillow: "1", "L;2", "L;4", "P;N").
    std::vector<std::uint8_t> palette_rgb;
    if (palette) {
      std::uint16_t *r = nullptr, *g = nullptr, *b = nullptr;
      if (TIFFGetField(tif, TIFFTAG_COLORMAP, &r, &g, &b) != 1 || r == nullptr || g == nullptr || b == nullptr)
        return Damaged(source, "a palette image without a color map");
      const std::size_t entries = std::size_t{1} << bits;
      palette_rgb.resize(entries * 3);
      for (std::size_t i = 0; i < entries; ++i) {  // Pillow keeps each entry's high byte
        palette_rgb[3 * i] = static_cast<std::uint8_t>(r[i] >> 8);
        palette_rgb[3 * i + 1] = static_cast<std::uint8_t>(g[i] >> 8);
        palette_rgb[3 * i + 2] = static_cast<std::uint8_t>(b[i] >> 8);
      }
    }
    out->mode = palette ? SourceMode::kRGB : SourceMode::kGray;
    out->data.resize(std::size_t{width} * height * (palette ? 3 : 1));
    const std::uint32_t max_level = (1u << bits) - 1;
    for (std::size_t y = 0; y < height; ++y)
      for (std::size_t x = 0; x < width; ++x) {
        std::uint32_t v;
        if (bits == 8) {
          v = raw[y * row_bytes + x];
        } else {
          const std::size_t bit = x * bits;
          v = (raw[y * row_bytes + bit / 8] >> (8 - bits - bit % 8)) & max_level;
        }
        if (palette) {
          std::memcpy(out->data.data() + (y * width + x) * 3, palette_rgb.data() + 3 * v, 3);
        } else {
          if (photometric == PHOTOMETRIC_MINISWHITE) v = max_level - v;
          out->data[y * width + x] = static_cast<std::uint8_t>(v * 255 / max_level);
        }
      }
    return Status::Ok();
  }
  if (gray && channels == 1 && bits == 16) {
    out->mode = SourceMode::kGray16;  // Pillow's "I;16", kept whole
    out->data.resize(std::size_t{width} * height * 2);
    auto* to = reinterpret_cast<std::uint16_t*>(out->data.data());
    for (std::size_t y = 0; y < height; ++y)
      for (std::size_t x = 0; x < width; ++x) {
        const std::uint32_t v = sample(x, y, 0);
        to[y * width + x] = static_cast<std::uint16_t>(v);  // min-is-white too: Pillow's "I;16" keeps the values
      }
    return Status::Ok();
  }
  // 8 bits a channel: 16-bit colour keeps each sample's high byte, as Pillow's "RGB;16" does.
  out->mode = gray ? (channels == 2 ? SourceMode::kGrayAlpha : SourceMode::kGray)
                   : (channels == 4 ? SourceMode::kRGBA : SourceMode::kRGB);
  out->data.resize(std::size_t{width} * height * channels);
  const int shift = bits == 16 ? 8 : 0;
  for (std::size_t y = 0; y < height; ++y)
    for (std::size_t x = 0; x < width; ++x)
      for (int c = 0; c < channels; ++c) {
        std::uint32_t v = sample(x, y, c) >> shift;
        if (c == 0 && photometric == PHOTOMETRIC_MINISWHITE) v = 255 - v;
        out->data[(y * width + x) * channels + c] = static_cast<std::uint8_t>(v);
      }
  return Status::Ok();
}

}  // namespace stoker::codec
