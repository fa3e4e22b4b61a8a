// The public single-field decoders (stoker/decode.h) over the codec layer.
#include <cstring>

#include <fmt/format.h>

#include "codec/image_decode.h"
#include "codec/npy.h"
#include "stoker/decode.h"

namespace stoker {

Result<HostTensor> DecodeImage(std::span<const std::byte> data, std::string_view mode, std::uint64_t max_pixels) {
  const auto color = codec::ParseColorMode(mode);
  if (!color) return Status::InvalidArgument(fmt::format("image mode '{}': RGB, L, RGBA or I;16", mode));
  codec::SourceImage source;
  codec::Pixels pixels;
  if (Status s = codec::DecodeImageAs(data, *color, max_pixels, &source, &pixels); !s.ok()) return s;
  HostTensor t;
  t.type = pixels.bytes_per_channel == 2 ? ElementType::kUInt16 : ElementType::kUInt8;
  t.shape = {pixels.height, pixels.width, pixels.channels};
  t.data.resize(pixels.data.size());
  std::memcpy(t.data.data(), pixels.data.data(), pixels.data.size());
  return t;
}

Result<HostTensor> DecodeNpy(std::span<const std::byte> data) {
  auto array = codec::ParseNpy(data);
  if (!array.ok()) return array.status();
  HostTensor t;
  t.type = array->type;
  t.shape = array->shape;
  t.data.resize(array->data.size());
  codec::CopyNpyData(*array, t.data.data());
  return t;
}

}  // namespace stoker
