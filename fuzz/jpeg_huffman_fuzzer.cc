// Differential fuzzing of the fast Huffman decoder (src/codec/jpeg_huffman.h)
// against libjpeg's own: the input is a byte choosing the region and scale,
// then a JPEG. Both decoders must fail together or give the same region and
// pixels; any difference traps.
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/jpeg_huffman.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stoker::codec;
  if (size < 2) return 0;
  const std::uint8_t mode = data[0];
  std::span<const std::byte> jpeg(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  const int scale = 1 << (mode & 3);
  Roi roi;
  if (mode & 4) roi = {(mode >> 3 & 3) * 8, (mode >> 5) * 5, 24, 17};
  // The loader refuses images over max_pixels before decoding; so does this.
  auto image = JpegSize(jpeg);
  if (image.ok() && std::uint64_t(image->width) * std::uint64_t(image->height) > (std::uint64_t{1} << 22)) return 0;
  DecodedRegion fast, plain;
  bool fast_decoded = false;
  const bool fast_ok = jpeg_internal::DecodeJpegUsing(jpeg, roi, scale, fast, true, &fast_decoded).ok();
  const bool plain_ok = jpeg_internal::DecodeJpegUsing(jpeg, roi, scale, plain, false).ok();
  if (fast_ok != plain_ok) __builtin_trap();
  if (fast_ok && (fast.width != plain.width || fast.height != plain.height || fast.origin_x != plain.origin_x ||
                  fast.origin_y != plain.origin_y || fast.pixels != plain.pixels))
    __builtin_trap();
  return 0;
}
