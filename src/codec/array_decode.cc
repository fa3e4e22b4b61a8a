#include "codec/array_decode.h"

#include <optional>

#include "codec/image_decode.h"
#include "codec/npy.h"
#include "codec/png.h"
#include "codec/tiff.h"

namespace stoker::codec {

Status DecodeArrayTensor(std::span<const std::byte> bytes, std::uint64_t max_pixels, HostTensor* out) {
  const std::optional<ImageFormat> format = DetectImageFormat(bytes);
  if (format == ImageFormat::kTiff) return DecodeTiffArray(bytes, max_pixels, out);
  if (format == ImageFormat::kPng) return DecodePngArray(bytes, max_pixels, out);
  return DecodeNpyTensor(bytes, out);
}

}  // namespace stoker::codec
