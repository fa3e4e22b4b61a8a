// Fuzzes pack's image re-encoding on arbitrary bytes: the EXIF orientation
// parser, then (for what decodes) turning, resizing and encoding. Malformed
// input must give an error or orientation 1, never a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/exif.h"
#include "prepare/jpeg_shrink.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const int orientation = stoker::codec::JpegExifOrientation(bytes);
  if (orientation < 1 || orientation > 8) __builtin_trap();
  if (size > 0) (void)stoker::prepare::ShrinkJpeg(bytes, 1 + data[0] % 16, 50, /*max_pixels=*/1 << 20);
  return 0;
}
