// An owned 8-bit image, rows of width * channels bytes without padding:
// what augmentation steps read and write between the decode and the final
// write into the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::transform {

struct Size {
  int width = 0, height = 0;
  friend bool operator==(const Size&, const Size&) = default;
};

struct Image {
  int width = 0, height = 0, channels = 3;
  std::vector<std::uint8_t> pixels;

  // Sizes the buffer (contents unspecified; capacity is reused).
  void Reset(int w, int h, int c) {
    width = w;
    height = h;
    channels = c;
    pixels.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(h) * static_cast<std::size_t>(c));
  }
  [[nodiscard]] Size size() const { return {width, height}; }
  [[nodiscard]] std::size_t stride() const { return static_cast<std::size_t>(width) * channels; }
  [[nodiscard]] std::uint8_t* row(int y) { return pixels.data() + static_cast<std::size_t>(y) * stride(); }
  [[nodiscard]] const std::uint8_t* row(int y) const { return pixels.data() + static_cast<std::size_t>(y) * stride(); }
};

}  // namespace stoker::transform
