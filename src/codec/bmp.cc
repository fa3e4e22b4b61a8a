#include "codec/bmp.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

// How the raster's pixels are laid out: Pillow's raw modes.
enum class Raw : std::uint8_t {
  kIndex1,  // "P;1", and "1" (a black-and-white palette)
  kIndex4,  // "P;4"
  kIndex8,  // "P", and "L" (a palette of greys)
  kBgr15,   // "BGR;15": 16 bits, 5-5-5
  kBgr16,   // "BGR;16": 16 bits, 5-6-5
  kBgr,     // 24 bits
  kBgrx,    // 32 bits, the fourth byte ignored
  kXbgr,
  kAbgr,  // alpha first
  kRgba,
  kBgra,
};

constexpr std::uint32_t kRaw = 0, kRle8 = 1, kRle4 = 2, kBitfields = 3;

std::uint16_t U16(const unsigned char* p) {
  return static_cast<std::uint16_t>(p[0] | p[1] << 8);
}
std::uint32_t U32(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}

struct Header {
  std::uint32_t width = 0, height = 0;
  bool top_down = false;
  int bits = 0;
  std::uint32_t compression = kRaw;
  Raw raw = Raw::kIndex8;
  bool palette_image = false;
  bool grey = false;  // a palette of only greys: Pillow's "L" or "1"
  // The palette as Pillow holds it: 256 entries, black where the file's
  // palette has none (grey i in a palette of greys).
  std::array<std::array<std::uint8_t, 3>, 256> palette{};
  std::size_t raster_at = 0;
  std::uint64_t stride = 0;  // bytes a row of an uncompressed raster
};

Status Unsupported(std::string_view what) {
  return Status::Unimplemented(
      fmt::format("a BMP {}: stoker decodes BMPs of 1, 4, 8, 16, 24 and 32 bits a pixel, uncompressed, with "
                  "bitfields Pillow reads, or RLE8/RLE4 (convert it to PNG)",
                  what));
}

// Pillow's BmpImageFile._bitmap, with every read checked against the data.
Result<Header> ReadHeader(std::span<const std::byte> data) {
  const auto* b = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t size = data.size();
  if (!IsBmp(data)) return Status::Corruption("not a BMP: it does not start with BM");
  if (size < 18) return Status::Corruption(fmt::format("truncated BMP: {} bytes, the file header needs 18", size));
  std::uint64_t offset = U32(b + 10);
  const std::uint32_t header_size = U32(b + 14);
  // A header longer than the file is damage; one of a size BMP does not
  // define, a variant.
  if (size < 14 + std::uint64_t{header_size})
    return Status::Corruption(
        fmt::format("truncated or damaged BMP: {} bytes, its header claims {}", size, header_size));
  if (header_size != 12 && header_size != 40 && header_size != 64 && header_size != 108 && header_size != 124)
    return Unsupported(fmt::format("header of {} bytes (12, 40, 64, 108 or 124 are BMP's)", header_size));
  const unsigned char* h = b + 18;  // the header after its size
  Header header;
  std::uint64_t colors = 0;
  int palette_padding = 4;
  std::size_t at = 14 + header_size;  // where the palette (or 40-byte headers' masks) starts
  std::array<std::uint32_t, 4> masks{};
  if (header_size == 12) {
    header.width = U16(h);
    header.height = U16(h + 2);
    header.bits = U16(h + 6);
    palette_padding = 3;
  } else {
    header.top_down = h[7] == 0xFF;
    header.width = U32(h);
    header.height = header.top_down ? static_cast<std::uint32_t>((std::uint64_t{1} << 32) - U32(h + 4)) : U32(h + 4);
    header.bits = U16(h + 10);
    header.compression = U32(h + 12);
    colors = U32(h + 28);
    if (header.compression == kBitfields) {
      if (header_size >= 56) {
        for (int i = 0; i < 4; ++i) masks[static_cast<std::size_t>(i)] = U32(h + 36 + 4 * i);
      } else {
        if (size < at + 12) return Status::Corruption("truncated BMP: its bitfield masks run past the end of the file");
        for (int i = 0; i < 3; ++i) masks[static_cast<std::size_t>(i)] = U32(b + at + 4 * i);
        at += 12;
      }
    }
  }
  if (header.width == 0 || header.height == 0 ||
      header.width > static_cast<std::uint32_t>(std::numeric_limits<int>::max()) ||
      header.height > static_cast<std::uint32_t>(std::numeric_limits<int>::max()))
    return Status::Corruption(fmt::format("BMP of {}x{} pixels", header.width, header.height));
  const int bits = header.bits;
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32)
    return Unsupported(fmt::format("of {} bits a pixel", bits));
  if (colors == 0) colors = std::uint64_t{1} << bits;
  // Pillow's rule: data said to start right after the header leaves room
  // for a palette all the same.
  if (offset == 14 + std::uint64_t{header_size} && bits <= 8) offset += 4 * colors;
  header.palette_image = bits <= 8;
  header.raw = bits == 1    ? Raw::kIndex1
               : bits == 4  ? Raw::kIndex4
               : bits == 8  ? Raw::kIndex8
               : bits == 16 ? Raw::kBgr15
               : bits == 24 ? Raw::kBgr
                            : Raw::kBgrx;
  if (header.compression == kBitfields) {
    struct Layout {
      int bits;
      std::array<std::uint32_t, 4> masks;
      Raw raw;
    };
    static constexpr Layout kLayouts[] = {
        {32, {0xFF0000, 0xFF00, 0xFF, 0x0}, Raw::kBgrx},
        {32, {0xFF000000, 0xFF0000, 0xFF00, 0x0}, Raw::kXbgr},
        {32, {0xFF000000, 0xFF0000, 0xFF00, 0xFF}, Raw::kAbgr},
        {32, {0xFF, 0xFF00, 0xFF0000, 0xFF000000}, Raw::kRgba},
        {32, {0xFF0000, 0xFF00, 0xFF, 0xFF000000}, Raw::kBgra},
        {32, {0x0, 0x0, 0x0, 0x0}, Raw::kBgra},
        {24, {0xFF0000, 0xFF00, 0xFF, 0}, Raw::kBgr},
        {16, {0xF800, 0x7E0, 0x1F, 0}, Raw::kBgr16},
        {16, {0x7C00, 0x3E0, 0x1F, 0}, Raw::kBgr15},
    };
    bool known = false;
    for (const Layout& layout : kLayouts) {
      // 24- and 16-bit layouts compare the red, green and blue masks only.
      const bool same = layout.bits == 32
                            ? masks == layout.masks
                            : masks[0] == layout.masks[0] && masks[1] == layout.masks[1] && masks[2] == layout.masks[2];
      if (layout.bits == bits && same) {
        header.raw = layout.raw;
        known = true;
        break;
      }
    }
    if (!known)
      return Unsupported(fmt::format("of {} bits a pixel with bitfields {:#x} {:#x} {:#x} {:#x}", bits, masks[0],
                                     masks[1], masks[2], masks[3]));
  } else if (header.compression == kRle8 || header.compression == kRle4) {
    if (bits != (header.compression == kRle8 ? 8 : 4))
      return Unsupported(
          fmt::format("of {} bits a pixel with {} compression", bits, header.compression == kRle8 ? "RLE8" : "RLE4"));
  } else if (header.compression != kRaw) {
    return Unsupported(header.compression == 4   ? std::string("holding a JPEG")
                       : header.compression == 5 ? std::string("holding a PNG")
                                                 : fmt::format("with compression {}", header.compression));
  }
  for (int i = 0; i < 256; ++i) header.palette[static_cast<std::size_t>(i)].fill(static_cast<std::uint8_t>(i));
  if (header.palette_image) {
    if (colors > 65536) return Unsupported(fmt::format("palette of {} colours", colors));
    if (size < at + palette_padding * colors)
      return Status::Corruption(
          fmt::format("truncated BMP: its palette of {} colours runs past the end of the file", colors));
    // Pillow's check: every entry grey and equal to its index (0 and 255
    // for two colours).
    header.grey = true;
    for (std::uint64_t i = 0; i < colors; ++i) {
      const unsigned char* entry = b + at + palette_padding * i;  // blue, green, red
      const unsigned want = colors == 2 ? (i == 0 ? 0 : 255) : static_cast<unsigned>(i);
      if (entry[0] != want || entry[1] != want || entry[2] != want) header.grey = false;
      if (i < 256) header.palette[static_cast<std::size_t>(i)] = {entry[2], entry[1], entry[0]};
    }
    // An index past the palette: its value as grey in a palette of greys
    // (Pillow reads those as "L"), else black, as Pillow 13 has it (Pillow
    // 9.4 gave grey i there too).
    if (!header.grey)
      for (std::uint64_t i = colors; i < 256; ++i) header.palette[static_cast<std::size_t>(i)] = {0, 0, 0};
  }
  header.raster_at = offset <= size ? static_cast<std::size_t>(offset) : size;
  if (offset > size) return Status::Corruption(fmt::format("BMP raster at byte {}, past its {} bytes", offset, size));
  header.stride = ((std::uint64_t{header.width} * static_cast<unsigned>(bits) + 31) >> 3) & ~std::uint64_t{3};
  return header;
}

// The 5- or 6-bit field `v` (of `top`) scaled to 8 bits, as Pillow's unpackers do.
std::uint8_t Scale(unsigned v, unsigned top) {
  return static_cast<std::uint8_t>(v * 255 / top);
}

// One row of `width` pixels from `in` into `out` (channels as the mode):
// a loop for each layout, so that the layout is not decided per pixel.
void UnpackRow(const Header& header, const unsigned char* in, std::uint32_t width, int channels, std::uint8_t* out) {
  const std::size_t w = width;
  if (header.palette_image) {
    const auto& palette = header.palette;
    auto put = [&](std::size_t x, unsigned index) {
      if (channels == 1)
        out[x] = palette[index][0];
      else
        std::memcpy(out + 3 * x, palette[index].data(), 3);
    };
    switch (header.raw) {
      case Raw::kIndex1:
        for (std::size_t x = 0; x < w; ++x) put(x, in[x >> 3] >> (7 - (x & 7)) & 1);
        return;
      case Raw::kIndex4:
        for (std::size_t x = 0; x < w; ++x) put(x, in[x >> 1] >> ((x & 1) ? 0 : 4) & 15);
        return;
      default:
        if (channels == 1) {
          for (std::size_t x = 0; x < w; ++x) out[x] = palette[in[x]][0];
        } else {
          for (std::size_t x = 0; x < w; ++x) std::memcpy(out + 3 * x, palette[in[x]].data(), 3);
        }
        return;
    }
  }
  switch (header.raw) {
    case Raw::kBgr15:
      for (std::size_t x = 0; x < w; ++x, out += 3) {
        const unsigned v = U16(in + 2 * x);
        out[0] = Scale(v >> 10 & 31, 31), out[1] = Scale(v >> 5 & 31, 31), out[2] = Scale(v & 31, 31);
      }
      return;
    case Raw::kBgr16:
      for (std::size_t x = 0; x < w; ++x, out += 3) {
        const unsigned v = U16(in + 2 * x);
        out[0] = Scale(v >> 11 & 31, 31), out[1] = Scale(v >> 5 & 63, 63), out[2] = Scale(v & 31, 31);
      }
      return;
    case Raw::kBgr:
      for (std::size_t x = 0; x < w; ++x, in += 3, out += 3) out[0] = in[2], out[1] = in[1], out[2] = in[0];
      return;
    case Raw::kBgrx:
      for (std::size_t x = 0; x < w; ++x, in += 4, out += 3) out[0] = in[2], out[1] = in[1], out[2] = in[0];
      return;
    case Raw::kBgra:
      for (std::size_t x = 0; x < w; ++x, in += 4, out += 4)
        out[0] = in[2], out[1] = in[1], out[2] = in[0], out[3] = in[3];
      return;
    case Raw::kXbgr:
      for (std::size_t x = 0; x < w; ++x, in += 4, out += 3) out[0] = in[3], out[1] = in[2], out[2] = in[1];
      return;
    case Raw::kAbgr:
      for (std::size_t x = 0; x < w; ++x, in += 4, out += 4)
        out[0] = in[3], out[1] = in[2], out[2] = in[1], out[3] = in[0];
      return;
    case Raw::kRgba:
      std::memcpy(out, in, 4 * w);
      return;
    default:
      return;
  }
}

// The run-length data from `at` as one index a pixel, rows in file order
// (bottom-up unless top-down), into `indices` (width * height), as Pillow
// 13's BmpRleDecoder reads it: a run past the row's end is cut there, an
// end-of-line pads the row with index 0, a delta's offsets are the two
// bytes after it and an odd RLE4 absolute run keeps its last pixel (Pillow
// 9.4 reads two more bytes for a delta and drops that pixel). Corruption
// when the data ends before the image is full.
Status DecodeRle(std::span<const std::byte> data, const Header& header, std::vector<std::uint8_t>& indices) {
  const auto* b = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t size = data.size();
  const std::uint64_t xsize = header.width;
  const std::uint64_t total = xsize * header.height;
  const bool rle4 = header.compression == kRle4;
  indices.assign(total, 0);
  std::uint64_t len = 0, x = 0;
  std::size_t at = header.raster_at;
  auto put = [&](std::uint8_t v) {
    if (len < total) indices[len] = v;
    ++len;
  };
  while (len < total) {
    if (at + 2 > size) break;
    const unsigned count = b[at], byte = b[at + 1];
    at += 2;
    if (count != 0) {  // a run
      std::uint64_t n = count;
      if (x + n > xsize) n = x < xsize ? xsize - x : 0;
      for (std::uint64_t i = 0; i < n && len < total; ++i)
        put(rle4 ? static_cast<std::uint8_t>(i % 2 == 0 ? byte >> 4 : byte & 15) : static_cast<std::uint8_t>(byte));
      x += n;
      continue;
    }
    if (byte == 0) {  // end of line
      while (len % xsize != 0 && len < total) put(0);
      x = 0;
    } else if (byte == 1) {  // end of bitmap
      break;
    } else if (byte == 2) {  // delta: right, then up (rows, in file order)
      if (at + 2 > size) break;
      const std::uint64_t skip = b[at] + std::uint64_t{b[at + 1]} * xsize;
      at += 2;
      len = std::min(total, len + skip);
      x = len % xsize;
    } else {                                                    // absolute: `byte` pixels stored as they are
      const std::size_t stored = rle4 ? (byte + 1) / 2 : byte;  // RLE4: two a byte, the last maybe alone
      const std::size_t got = std::min(stored, size - at);
      for (std::size_t i = 0; i < (rle4 ? std::min<std::size_t>(byte, 2 * got) : got) && len < total; ++i)
        put(rle4 ? static_cast<std::uint8_t>(i % 2 == 0 ? b[at + i / 2] >> 4 : b[at + i / 2] & 15) : b[at + i]);
      at += got;
      if (got < stored) break;
      x += byte;
      if (at % 2 != 0) ++at;  // to a 16-bit boundary of the file
    }
  }
  if (len < total)
    return Status::Corruption(fmt::format("truncated {} BMP: its run-length data fills {} of its {}x{} pixels",
                                          rle4 ? "RLE4" : "RLE8", len, header.width, header.height));
  return Status::Ok();
}

}  // namespace

bool IsBmp(std::span<const std::byte> data) {
  return data.size() >= 2 && data[0] == std::byte{'B'} && data[1] == std::byte{'M'};
}

Result<ImageSize> BmpSize(std::span<const std::byte> data) {
  STOKER_ASSIGN_OR_RETURN(Header header, ReadHeader(data));
  return ImageSize{static_cast<int>(header.width), static_cast<int>(header.height)};
}

Status DecodeBmp(std::span<const std::byte> data, std::uint64_t max_pixels, SourceImage* out) {
  STOKER_ASSIGN_OR_RETURN(Header header, ReadHeader(data));
  STOKER_RETURN_IF_ERROR(CheckPixelLimit("BMP", header.width, header.height, max_pixels));
  const bool rle = header.compression == kRle8 || header.compression == kRle4;
  // Width and height are at most 2^31 - 1 and a pixel 32 bits: under 2^64.
  const std::uint64_t present = data.size() - header.raster_at, needed = header.stride * header.height;
  if (!rle && present < needed)
    return Status::Corruption(fmt::format("truncated BMP: {}x{} at {} bits needs {} raster bytes, {} are there",
                                          header.width, header.height, header.bits, needed, present));
  const bool alpha = header.raw == Raw::kAbgr || header.raw == Raw::kRgba || header.raw == Raw::kBgra;
  const int channels = header.palette_image && header.grey ? 1 : alpha ? 4 : 3;
  out->mode = channels == 1 ? SourceMode::kGray : channels == 4 ? SourceMode::kRGBA : SourceMode::kRGB;
  out->width = static_cast<int>(header.width);
  out->height = static_cast<int>(header.height);
  out->transparency = {};
  out->format = "BMP";
  const std::size_t row_bytes = std::size_t{header.width} * static_cast<std::size_t>(channels);
  std::vector<std::uint8_t> indices;
  try {
    // Without a pixel limit, run-length data (or a 1-bit raster, 24 bytes of
    // pixels a byte) can ask for more than there is.
    out->data.resize(row_bytes * header.height);
    if (rle) indices.reserve(std::uint64_t{header.width} * header.height);
  } catch (const std::exception&) {
    return Status::ResourceExhausted(fmt::format(
        "BMP of {}x{}: cannot allocate its pixels (max_image_pixels bounds it)", header.width, header.height));
  }
  if (rle) {
    STOKER_RETURN_IF_ERROR(DecodeRle(data, header, indices));
    header.raw = Raw::kIndex8;  // one index a byte now
  }
  const auto* raster = rle ? indices.data() : reinterpret_cast<const unsigned char*>(data.data()) + header.raster_at;
  const std::uint64_t stride = rle ? header.width : header.stride;
  for (std::uint32_t row = 0; row < header.height; ++row) {
    const std::uint32_t y = header.top_down ? row : header.height - 1 - row;  // rows in file order
    UnpackRow(header, raster + stride * row, header.width, channels, out->data.data() + row_bytes * y);
  }
  return Status::Ok();
}

}  // namespace stoker::codec
