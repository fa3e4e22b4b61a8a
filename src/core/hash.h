// xxh3-64, the checksum used throughout stoker's formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>
#if defined(STOKER_XXH_DISPATCH) && defined(__x86_64__)
// libxxhash's dispatching entry points use the widest vector unit the CPU
// has, found at run time: with AVX2, 36.7 GB/s against the 11.7 GB/s of the
// SSE2 code an inlined xxhash compiles to for a baseline x86-64 (on data in
// L2; the checkpoint's blocks, the packs' payloads, downloads). The build
// checks that the library has them (CMakeLists.txt).
#include <xxh_x86dispatch.h>
#endif

namespace stoker {

[[nodiscard]] inline std::uint64_t Xxh3(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

// Streaming xxh3-64; equal to Xxh3() of the concatenated updates.
class Xxh3Stream {
 public:
  Xxh3Stream() { (void)XXH3_64bits_reset(&state_); }
  void Update(std::span<const std::byte> data) { (void)XXH3_64bits_update(&state_, data.data(), data.size()); }
  [[nodiscard]] std::uint64_t Digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace stoker
