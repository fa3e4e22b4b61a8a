#include "codec/png.h"

#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <spng.h>

namespace stoker::codec {
namespace {

struct CtxFree {
  void operator()(spng_ctx* ctx) const { spng_ctx_free(ctx); }
};
using Ctx = std::unique_ptr<spng_ctx, CtxFree>;

// Text and other ancillary chunks are kept by libspng until the image is
// read: a bound on them keeps a hostile file from taking memory.
constexpr std::size_t kChunkLimit = 64u << 20;

Status Error(std::string_view what, int code) {
  return Status::Corruption(fmt::format("PNG: {}: {}", what, spng_strerror(code)));
}

Result<Ctx> Open(std::span<const std::byte> png, spng_ihdr* ihdr) {
  Ctx ctx(spng_ctx_new(0));
  if (!ctx) return Status::ResourceExhausted("PNG: libspng could not make a decoder");
  int r = spng_set_crc_action(ctx.get(), SPNG_CRC_ERROR, SPNG_CRC_ERROR);
  if (r == 0) r = spng_set_chunk_limits(ctx.get(), kChunkLimit, kChunkLimit);
  if (r != 0) return Status::Internal(fmt::format("PNG: libspng setup failed: {}", spng_strerror(r)));
  r = spng_set_png_buffer(ctx.get(), png.data(), png.size());
  if (r == 0) r = spng_get_ihdr(ctx.get(), ihdr);
  if (r != 0) return Error("bad header", r);
  return ctx;
}

Status CheckPngPixels(const spng_ihdr& ihdr, std::uint64_t max_pixels) {
  return CheckPixelLimit("PNG", ihdr.width, ihdr.height, max_pixels);
}

// The chunks after the image, to IEND, read and their CRCs checked: the
// decoder stops once the image is whole, which would leave the last IDAT's
// CRC (and a cut file's missing end) unchecked.
Status ReadToEnd(spng_ctx* ctx) {
  const int r = spng_decode_chunks(ctx);
  if (r != 0) return Error("damaged or cut after the image data", r);
  return Status::Ok();
}

}  // namespace

Result<ImageSize> PngSize(std::span<const std::byte> png) {
  spng_ihdr ihdr{};
  auto ctx = Open(png, &ihdr);
  if (!ctx.ok()) return ctx.status();
  return ImageSize{static_cast<int>(ihdr.width), static_cast<int>(ihdr.height)};
}

Status DecodePng(std::span<const std::byte> png, std::uint64_t max_pixels, SourceImage* out) {
  spng_ihdr ihdr{};
  auto opened = Open(png, &ihdr);
  if (!opened.ok()) return opened.status();
  spng_ctx* ctx = opened->get();
  STOKER_RETURN_IF_ERROR(CheckPngPixels(ihdr, max_pixels));

  // What Pillow opens each color type as (PngImagePlugin's _MODES).
  int format = SPNG_FMT_PNG;
  int flags = 0;
  bool high_bytes = false;  // 16-bit colour: Pillow keeps the high byte
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
      if (ihdr.bit_depth == 16) {
        out->mode = SourceMode::kGray16;
      } else {
        out->mode = SourceMode::kGray;
        format = SPNG_FMT_G8;  // 1, 2 and 4 bits scaled to 0..255, as Pillow's "1", "L;2", "L;4"
      }
      break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      out->mode = SourceMode::kGrayAlpha;
      high_bytes = ihdr.bit_depth == 16;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR:
      out->mode = SourceMode::kRGB;
      high_bytes = ihdr.bit_depth == 16;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      out->mode = SourceMode::kRGBA;
      high_bytes = ihdr.bit_depth == 16;
      break;
    case SPNG_COLOR_TYPE_INDEXED:
      out->mode = SourceMode::kRGBA;
      format = SPNG_FMT_RGBA8;
      flags = SPNG_DECODE_TRNS;
      break;
    default:
      return Status::Corruption(fmt::format("PNG: unknown color type {}", static_cast<int>(ihdr.color_type)));
  }

  std::size_t size = 0;
  int r = spng_decoded_image_size(ctx, format, &size);
  if (r != 0) return Error("bad image size", r);
  std::vector<std::uint8_t>& data = out->data;
  data.resize(size);
  r = spng_decode_image(ctx, data.data(), size, format, flags);
  if (r != 0) return Error("damaged image data", r);
  STOKER_RETURN_IF_ERROR(ReadToEnd(ctx));

  if (high_bytes) {
    // Host-endian 16-bit samples -> their high bytes, in place.
    const std::size_t samples = size / 2;
    for (std::size_t i = 0; i < samples; ++i) {
      std::uint16_t v = 0;
      std::memcpy(&v, data.data() + 2 * i, 2);
      data[i] = static_cast<std::uint8_t>(v >> 8);
    }
    data.resize(samples);
  }

  out->transparency = {};
  if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE || ihdr.color_type == SPNG_COLOR_TYPE_TRUECOLOR) {
    spng_trns trns{};
    r = spng_get_trns(ctx, &trns);
    if (r == 0) {
      if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE) {
        out->transparency.gray = true;
        out->transparency.value = trns.gray;
      } else {
        out->transparency.rgb = true;
        out->transparency.red = trns.red, out->transparency.green = trns.green, out->transparency.blue = trns.blue;
      }
    } else if (r != SPNG_ECHUNKAVAIL) {
      return Error("bad tRNS chunk", r);
    }
  }
  out->width = static_cast<int>(ihdr.width);
  out->height = static_cast<int>(ihdr.height);
  out->format = "PNG";
  return Status::Ok();
}

Status DecodePngArray(std::span<const std::byte> png, std::uint64_t max_pixels, HostTensor* out) {
  spng_ihdr ihdr{};
  auto opened = Open(png, &ihdr);
  if (!opened.ok()) return opened.status();
  spng_ctx* ctx = opened->get();
  STOKER_RETURN_IF_ERROR(CheckPngPixels(ihdr, max_pixels));
  int samples = 1;
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE:
    case SPNG_COLOR_TYPE_INDEXED:
      break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      samples = 2;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR:
      samples = 3;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      samples = 4;
      break;
    default:
      return Status::Corruption(fmt::format("PNG: unknown color type {}", static_cast<int>(ihdr.color_type)));
  }
  // SPNG_FMT_PNG: the samples as stored, 16-bit ones host-endian; rows of
  // 1-, 2- and 4-bit samples stay packed (each row starts on a byte).
  std::size_t size = 0;
  int r = spng_decoded_image_size(ctx, SPNG_FMT_PNG, &size);
  if (r != 0) return Error("bad image size", r);
  const std::size_t width = ihdr.width, height = ihdr.height;
  const int depth = ihdr.bit_depth;
  out->type = depth == 16 ? ElementType::kUInt16 : ElementType::kUInt8;
  out->shape = {static_cast<std::int64_t>(height), static_cast<std::int64_t>(width)};
  if (samples > 1) out->shape.push_back(samples);
  if (depth >= 8) {
    out->data.resize(size);
    r = spng_decode_image(ctx, out->data.data(), size, SPNG_FMT_PNG, 0);
    if (r != 0) return Error("damaged image data", r);
    return ReadToEnd(ctx);
  }
  const std::size_t row_bytes = (width * depth + 7) / 8;
  out->data.resize(width * height);
  auto* to = reinterpret_cast<std::uint8_t*>(out->data.data());
  if (ihdr.color_type == SPNG_COLOR_TYPE_GRAYSCALE) {
    // SPNG_FMT_G8 scales the values to 0..255 exactly (by 255, 85 or 17):
    // undone here. (libspng 0.7's SPNG_FMT_PNG misplaces the samples of
    // interlaced images below 8 bits; G8 places them right.)
    r = spng_decode_image(ctx, to, width * height, SPNG_FMT_G8, 0);
    if (r != 0) return Error("damaged image data", r);
    const auto scale = static_cast<std::uint8_t>(255 / ((1 << depth) - 1));
    for (std::size_t i = 0; i < width * height; ++i) to[i] = static_cast<std::uint8_t>(to[i] / scale);
    return ReadToEnd(ctx);
  }
  // Palette indices below 8 bits: no format expands them, so they are read
  // a scanline at a time, packed, and each pixel put where its pass puts it
  // (Adam7's seven, or the one pass of a plain image), most significant bits
  // first. (libspng 0.7's own deinterlacing misplaces packed pixels.)
  static constexpr int kStartX[7] = {0, 4, 0, 2, 0, 1, 0}, kStepX[7] = {8, 8, 4, 4, 2, 2, 1};
  const bool interlaced = ihdr.interlace_method != SPNG_INTERLACE_NONE;
  r = spng_decode_image(ctx, nullptr, 0, SPNG_FMT_PNG, SPNG_DECODE_PROGRESSIVE);
  if (r != 0) return Error("damaged image data", r);
  thread_local std::vector<std::uint8_t> line;
  line.resize(row_bytes);
  const unsigned mask = (1u << depth) - 1;
  std::size_t rows = 0;
  while (true) {
    spng_row_info info{};
    r = spng_get_row_info(ctx, &info);
    if (r == SPNG_EOI) break;
    // The last scanline comes with SPNG_EOI: it is unpacked, then the loop ends.
    if (r == 0) r = spng_decode_scanline(ctx, line.data(), line.size());
    if (r != 0 && r != SPNG_EOI) return Error("damaged image data", r);
    if (info.row_num >= height || info.pass < 0 || info.pass > 6)
      return Status::Internal("PNG: libspng gave a scanline outside the image");
    const std::size_t x0 = interlaced ? kStartX[info.pass] : 0, dx = interlaced ? kStepX[info.pass] : 1;
    std::uint8_t* row = to + static_cast<std::size_t>(info.row_num) * width;
    for (std::size_t i = 0, x = x0; x < width; ++i, x += dx) {
      const std::size_t bit = i * depth;
      row[x] = static_cast<std::uint8_t>((line[bit / 8] >> (8 - depth - bit % 8)) & mask);
    }
    ++rows;
    if (r == SPNG_EOI) break;
  }
  if (rows == 0 && height > 0) return Status::Corruption("PNG: no image rows");
  return ReadToEnd(ctx);
}

}  // namespace stoker::codec
