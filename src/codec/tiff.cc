#include "codec/tiff.h"

#include <tiffio.h>

#include <algorithm>
#include <cstdarg>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

// The bytes libtiff reads, as a client "file" it maps whole.
struct Source {
  std::span<const std::byte> data;
  toff_t at = 0;
  std::string error;  // libtiff's first error message for this file
};

tmsize_t Read(thandle_t h, void* buf, tmsize_t n) {
  auto* s = static_cast<Source*>(h);
  if (n < 0 || s->at >= s->data.size()) return 0;
  const auto count = std::min<toff_t>(static_cast<toff_t>(n), s->data.size() - s->at);
  std::memcpy(buf, s->data.data() + s->at, count);
  s->at += count;
  return static_cast<tmsize_t>(count);
}
tmsize_t Write(thandle_t, void*, tmsize_t) {
  return 0;
}
toff_t Seek(thandle_t h, toff_t offset, int whence) {
  auto* s = static_cast<Source*>(h);
  toff_t base = whence == SEEK_CUR ? s->at : whence == SEEK_END ? s->data.size() : 0;
  s->at = base + offset;
  return s->at;
}
int Close(thandle_t) {
  return 0;
}
toff_t Size(thandle_t h) {
  return static_cast<Source*>(h)->data.size();
}
int Map(thandle_t h, void** base, toff_t* size) {
  auto* s = static_cast<Source*>(h);
  *base = const_cast<std::byte*>(s->data.data());  // read-only: the file is opened "r"
  *size = s->data.size();
  return 1;
}
void Unmap(thandle_t, void*, toff_t) {}

int OnError(TIFF*, void* user, const char* module, const char* format, va_list args) {
  auto* s = static_cast<Source*>(user);
  if (s->error.empty()) {
    char text[512];
    std::vsnprintf(text, sizeof text, format, args);
    s->error = module != nullptr && *module != '\0' ? fmt::format("{}: {}", module, text) : text;
  }
  return 1;
}
int OnWarning(TIFF*, void*, const char*, const char*, va_list) {
  return 1;
}  // Pillow reads on too

struct CloseTiff {
  void operator()(TIFF* t) const { TIFFClose(t); }
};
using TiffHandle = std::unique_ptr<TIFF, CloseTiff>;

// Opens `source` (kept alive by the caller) with errors collected into it;
// no single allocation of libtiff's over `max_alloc` bytes (a header's
// claims are checked against it before they are believed).
Result<TiffHandle> Open(Source& source, tmsize_t max_alloc) {
  std::unique_ptr<TIFFOpenOptions, decltype(&TIFFOpenOptionsFree)> options(TIFFOpenOptionsAlloc(),
                                                                           &TIFFOpenOptionsFree);
  if (!options) return Status::ResourceExhausted("TIFF: out of memory");
  TIFFOpenOptionsSetErrorHandlerExtR(options.get(), OnError, &source);
  TIFFOpenOptionsSetWarningHandlerExtR(options.get(), OnWarning, &source);
  TIFFOpenOptionsSetMaxSingleMemAlloc(options.get(), max_alloc);
  TIFF* tif = TIFFClientOpenExt("TIFF", "r", &source, Read, Write, Seek, Close, Size, Map, Unmap, options.get());
  if (tif == nullptr)
    return Status::Corruption(
        fmt::format("TIFF: cannot be opened ({})", source.error.empty() ? "damaged header" : source.error));
  return TiffHandle(tif);
}

template <typename T>
T Tag(TIFF* tif, ttag_t tag, T fallback) {
  T value = fallback;
  if (TIFFGetFieldDefaulted(tif, tag, &value) != 1) return fallback;
  return value;
}

Status Damaged(const Source& source, std::string_view what) {
  return Status::Corruption(fmt::format("TIFF: {} ({})", what, source.error.empty() ? "damaged data" : source.error));
}

// The image's samples as stored, unpacked by libtiff's codec: `planes`
// planes (1 when contiguous) of height rows of `row_bytes` each, a pixel
// taking `pixel_bits` of a plane's row.
Status ReadRaw(TIFF* tif, const Source& source, std::uint32_t width, std::uint32_t height, std::uint16_t planes,
               std::size_t row_bytes, std::size_t pixel_bits, std::vector<std::uint8_t>& raw) {
  raw.resize(row_bytes * height * planes);  // every byte is written below
  if (TIFFIsTiled(tif)) {
    std::uint32_t tile_w = 0, tile_h = 0;
    if (TIFFGetField(tif, TIFFTAG_TILEWIDTH, &tile_w) != 1 || TIFFGetField(tif, TIFFTAG_TILELENGTH, &tile_h) != 1 ||
        tile_w == 0 || tile_h == 0)
      return Damaged(source, "a tiled image without a tile size");
    // Tiles may overhang the image, not dwarf it: a header's tile size is checked before a tile is allocated.
    const std::uint64_t tile_area = std::uint64_t{tile_w} * tile_h;
    if (tile_area > std::max<std::uint64_t>(std::uint64_t{4} * width * height, 1 << 22))
      return Damaged(source, fmt::format("tiles of {}x{} for an image of {}x{}", tile_w, tile_h, width, height));
    const tmsize_t tile_size = TIFFTileSize(tif);
    const tmsize_t tile_row = TIFFTileRowSize(tif);
    if (tile_size <= 0 || tile_row <= 0) return Damaged(source, "a bad tile size");
    std::vector<std::uint8_t> tile(static_cast<std::size_t>(tile_size));
    for (std::uint16_t p = 0; p < planes; ++p)
      for (std::uint32_t y = 0; y < height; y += tile_h)
        for (std::uint32_t x = 0; x < width; x += tile_w) {
          if (TIFFReadEncodedTile(tif, TIFFComputeTile(tif, x, y, 0, p), tile.data(), tile_size) < 0)
            return Damaged(source, fmt::format("tile at ({}, {}) does not decode", x, y));
          const std::size_t start = x * pixel_bits / 8;  // tile widths are multiples of 16: whole bytes
          const std::size_t n = std::min<std::size_t>(static_cast<std::size_t>(tile_row), row_bytes - start);
          for (std::uint32_t r = 0; r < tile_h && y + r < height; ++r)
            std::memcpy(raw.data() + (p * height + y + r) * row_bytes + start,
                        tile.data() + static_cast<std::size_t>(r) * tile_row, n);
        }
    return Status::Ok();
  }
  const std::uint32_t rows_per_strip = std::min(Tag<std::uint32_t>(tif, TIFFTAG_ROWSPERSTRIP, height), height);
  if (rows_per_strip == 0) return Damaged(source, "zero rows a strip");
  const tmsize_t strip_size = TIFFStripSize(tif);
  if (strip_size <= 0 || static_cast<std::size_t>(strip_size) < row_bytes * std::min(rows_per_strip, height))
    return Damaged(source, "a bad strip size");
  const std::uint32_t strips_per_plane = (height + rows_per_strip - 1) / rows_per_strip;
  for (std::uint16_t p = 0; p < planes; ++p)
    for (std::uint32_t s = 0; s < strips_per_plane; ++s) {
      // Straight into place: libtiff decodes at most the size given.
      const std::uint32_t first = s * rows_per_strip, rows = std::min(rows_per_strip, height - first);
      const std::size_t want = row_bytes * rows;
      const tmsize_t got = TIFFReadEncodedStrip(
          tif, p * strips_per_plane + s, raw.data() + (p * height + first) * row_bytes, static_cast<tmsize_t>(want));
      if (got < 0 || static_cast<std::size_t>(got) < want)
        return Damaged(source, fmt::format("strip {} does not decode", p * strips_per_plane + s));
    }
  return Status::Ok();
}

}  // namespace

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
  const std::uint64_t pixels = std::uint64_t{width} * height;
  if (max_pixels != 0 && pixels > max_pixels)
    return Status::Corruption(fmt::format(
        "TIFF of {}x{} = {} pixels is over the limit of {} (a decompression bomb?); max_image_pixels raises it", width,
        height, pixels, max_pixels));
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
    return Status::Unimplemented(fmt::format(
        "TIFF: {}; stoker decodes 1- to 16-bit grayscale, 8- and 16-bit RGB(A) and palette TIFFs (read this one "
        "with stoker.Bytes and decode it in map=, e.g. with tifffile)",
        what));
  };
  if (format != SAMPLEFORMAT_UINT)
    return refuse(format == SAMPLEFORMAT_IEEEFP ? fmt::format("{}-bit floating-point samples", bits)
                                                : fmt::format("{}-bit signed samples", bits));
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
    STOKER_RETURN_IF_ERROR(ReadRaw(tif, source, width, height, 1, row_bytes, pixel_bits, out->data));
    out->mode = bits == 16      ? SourceMode::kGray16
                : channels == 1 ? SourceMode::kGray
                : channels == 2 ? SourceMode::kGrayAlpha
                : channels == 3 ? SourceMode::kRGB
                                : SourceMode::kRGBA;
    return Status::Ok();
  }
  std::vector<std::uint8_t> raw;
  STOKER_RETURN_IF_ERROR(ReadRaw(tif, source, width, height, planes, row_bytes, pixel_bits, raw));

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
