// Fuzzes the JPEG header parsers on arbitrary bytes (EXIF orientation, the
// traits the GPU decode plan reads) and pack's image re-encoding: (for what decodes) turning, resizing and encoding.
// Malformed input must give an error or orientation 1, never a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/exif.h"
#include "codec/jpeg_traits.h"
#include "prepare/jpeg_shrink.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  const int orientation = stoker::codec::JpegExifOrientation(bytes);
  if (orientation < 1 || orientation > 8) __builtin_trap();
  if (auto traits = stoker::codec::ReadJpegTraits(bytes); traits.ok()) {
    (void)stoker::codec::PlanGpuDecode(*traits, {.hardware = true, .hardware_max_side = 4096});
  }
  if (size > 0) (void)stoker::prepare::ShrinkJpeg(bytes, 1 + data[0] % 16, 50, /*max_pixels=*/1 << 20);
  return 0;
}
