#include "codec/tiff_reader.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <vector>

#include <fmt/format.h>

namespace stoker::codec::tiff_internal {
namespace {

// The client "file" libtiff reads: the bytes, mapped whole.
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

}  // namespace

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

std::string_view SampleFormatName(std::uint16_t format) {
  switch (format) {
    case SAMPLEFORMAT_UINT:
      return "unsigned";
    case SAMPLEFORMAT_INT:
      return "signed";
    case SAMPLEFORMAT_IEEEFP:
      return "floating-point";
    case SAMPLEFORMAT_VOID:
      return "untyped (void)";
    case SAMPLEFORMAT_COMPLEXINT:
      return "complex";
    case SAMPLEFORMAT_COMPLEXIEEEFP:
      return "complex floating-point";
    default:
      return "unknown-format";
  }
}

Status Damaged(const Source& source, std::string_view what) {
  return Status::Corruption(fmt::format("TIFF: {} ({})", what, source.error.empty() ? "damaged data" : source.error));
}

Status ReadRaw(TIFF* tif, const Source& source, std::uint32_t width, std::uint32_t height, std::uint16_t planes,
               std::size_t row_bytes, std::size_t pixel_bits, std::uint8_t* out) {
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
            std::memcpy(out + (p * height + y + r) * row_bytes + start,
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
      const tmsize_t got = TIFFReadEncodedStrip(tif, p * strips_per_plane + s, out + (p * height + first) * row_bytes,
                                                static_cast<tmsize_t>(want));
      if (got < 0 || static_cast<std::size_t>(got) < want)
        return Damaged(source, fmt::format("strip {} does not decode", p * strips_per_plane + s));
    }
  return Status::Ok();
}

}  // namespace stoker::codec::tiff_internal
