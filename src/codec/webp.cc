#include "codec/webp.h"

#include <fmt/format.h>
#include <webp/decode.h>

namespace stoker::codec {
namespace {

std::string_view Why(VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_OK:
      return "ok";
    case VP8_STATUS_OUT_OF_MEMORY:
      return "out of memory";
    case VP8_STATUS_INVALID_PARAM:
      return "invalid parameter";
    case VP8_STATUS_BITSTREAM_ERROR:
      return "bitstream error";
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return "unsupported feature";
    case VP8_STATUS_SUSPENDED:
      return "suspended";
    case VP8_STATUS_USER_ABORT:
      return "aborted";
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return "truncated (not enough data)";
  }
  return "unknown error";
}

Status Features(std::span<const std::byte> webp, WebPBitstreamFeatures* features) {
  const auto* data = reinterpret_cast<const std::uint8_t*>(webp.data());
  const VP8StatusCode r = WebPGetFeatures(data, webp.size(), features);
  if (r != VP8_STATUS_OK) return Status::Corruption(fmt::format("WebP: bad header: {}", Why(r)));
  return Status::Ok();
}

}  // namespace

Result<ImageSize> WebpSize(std::span<const std::byte> webp) {
  WebPBitstreamFeatures features{};
  if (Status s = Features(webp, &features); !s.ok()) return s;
  return ImageSize{features.width, features.height};
}

Status DecodeWebp(std::span<const std::byte> webp, std::uint64_t max_pixels, SourceImage* out) {
  WebPBitstreamFeatures features{};
  if (Status s = Features(webp, &features); !s.ok()) return s;
  if (features.has_animation)
    return Status::Unimplemented("WebP: an animation; stoker decodes still WebP images (re-encode the frame wanted)");
  STOKER_RETURN_IF_ERROR(CheckPixelLimit("WebP", static_cast<std::uint64_t>(features.width),
                                         static_cast<std::uint64_t>(features.height), max_pixels));
  // Pillow decodes through libwebp to RGBA and keeps RGB when there is no
  // alpha; libwebp's defaults (fancy upsampling) are the same here.
  out->mode = features.has_alpha ? SourceMode::kRGBA : SourceMode::kRGB;
  const int channels = features.has_alpha ? 4 : 3;
  const std::size_t stride = static_cast<std::size_t>(features.width) * channels;
  out->data.resize(stride * static_cast<std::size_t>(features.height));
  const auto* data = reinterpret_cast<const std::uint8_t*>(webp.data());
  const std::uint8_t* decoded =
      features.has_alpha
          ? WebPDecodeRGBAInto(data, webp.size(), out->data.data(), out->data.size(), static_cast<int>(stride))
          : WebPDecodeRGBInto(data, webp.size(), out->data.data(), out->data.size(), static_cast<int>(stride));
  if (decoded == nullptr) return Status::Corruption("WebP: damaged or truncated image data");
  out->width = features.width;
  out->height = features.height;
  out->transparency = {};
  out->format = "WebP";
  return Status::Ok();
}

}  // namespace stoker::codec
