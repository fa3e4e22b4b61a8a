// xxh3-64, the checksum used throughout stoker's formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace stoker {

[[nodiscard]] inline std::uint64_t Xxh3(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

// Streaming xxh3-64; equal to Xxh3() of the concatenated updates.
class Xxh3Stream {
 public:
  Xxh3Stream() { XXH3_64bits_reset(&state_); }
  void Update(std::span<const std::byte> data) { XXH3_64bits_update(&state_, data.data(), data.size()); }
  [[nodiscard]] std::uint64_t Digest() const { return XXH3_64bits_digest(&state_); }

 private:
  XXH3_state_t state_;
};

}  // namespace stoker
