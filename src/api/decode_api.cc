// The public single-field decoders (stoker/decode.h) over the codec layer.
#include "codec/array_decode.h"
#include "codec/image_decode.h"
#include "codec/npy.h"
#include "stoker/decode.h"

namespace stoker {

Status CheckImageHeader(std::span<const std::byte> data) {
  return codec::CheckImageHeader(data);
}

std::string_view ImageFieldExtension(std::span<const std::byte> data) {
  return codec::ImageFieldExtension(data);
}

Result<HostTensor> DecodeImage(std::span<const std::byte> data, std::string_view mode, std::uint64_t max_pixels) {
  const auto color = codec::ParseColorMode(mode);
  if (!color) return codec::UnknownColorMode(mode);
  codec::SourceImage source;
  codec::Pixels pixels;
  HostTensor t;
  if (Status s = codec::DecodeImageTensor(data, *color, max_pixels, &source, &pixels, &t); !s.ok()) return s;
  return t;
}

Result<HostTensor> DecodeNpy(std::span<const std::byte> data) {
  HostTensor t;
  if (Status s = codec::DecodeNpyTensor(data, &t); !s.ok()) return s;
  return t;
}

Result<HostTensor> DecodeArray(std::span<const std::byte> data, std::uint64_t max_pixels) {
  HostTensor t;
  if (Status s = codec::DecodeArrayTensor(data, max_pixels, &t); !s.ok()) return s;
  return t;
}

}  // namespace stoker
