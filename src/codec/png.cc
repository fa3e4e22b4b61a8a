#include "codec/png.h"

#include <cstring>
#include <memory>

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
  const std::uint64_t pixels = std::uint64_t{ihdr.width} * ihdr.height;
  if (max_pixels != 0 && pixels > max_pixels)
    return Status::Corruption(fmt::format(
        "PNG of {}x{} = {} pixels is over the limit of {} (a decompression bomb?); max_image_pixels raises it",
        ihdr.width, ihdr.height, pixels, max_pixels));

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

}  // namespace stoker::codec
