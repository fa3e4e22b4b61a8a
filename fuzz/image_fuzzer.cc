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
  // The header check pack makes, and the field name it gives bytes by their
  // format: a header that passes is always of a format that has a name.
  const std::string_view ext = stoker::ImageFieldExtension(bytes);
  if (stoker::CheckImageHeader(bytes).ok() && ext.empty()) __builtin_trap();
  return 0;
}
