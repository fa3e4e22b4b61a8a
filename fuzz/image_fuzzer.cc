// Fuzzes the field image decoders on arbitrary bytes: format detection,
// PNG (libspng: every color type, bit depth, palette, tRNS, interlacing),
// WebP (libwebp), TIFF (libtiff: strips, tiles, planes, every depth and
// compression) and whole-image JPEG, then conversion to every mode.
// Malformed input must give an error, never a crash, an out-of-bounds
// access or an allocation beyond the pixel limit.
#include <cstddef>
#include <cstdint>
#include <span>

#include "stoker/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  // A small pixel limit: what passes it is cheap to decode, and a header
  // that claims more must be refused before anything is allocated.
  constexpr std::uint64_t kMaxPixels = 1 << 20;
  for (const char* mode : {"RGB", "L", "RGBA", "I;16"}) (void)stoker::DecodeImage(bytes, mode, kMaxPixels);
  return 0;
}
