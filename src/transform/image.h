// An owned 8-bit image, rows of width * channels bytes without padding:
// what augmentation steps read and write between the decode and the final
// write into the batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
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

// Copies one pixel of `Channels` bytes (0: `channels`, known only at run
// time). Loops over pixels take the channel count as a template argument
// (DispatchChannels), so the usual 1, 3 and 4 channels copy without a call
// to memcpy per pixel.
template <int Channels>
inline void CopyPixel(std::uint8_t* dst, const std::uint8_t* src, int channels) {
  if constexpr (Channels > 0) {
    std::memcpy(dst, src, Channels);
  } else {
    std::memcpy(dst, src, static_cast<std::size_t>(channels));
  }
}

// Calls `body(std::integral_constant<int, C>{})` with C = `channels` for 1, 3
// and 4 channels, C = 0 otherwise.
template <typename Body>
inline void DispatchChannels(int channels, Body&& body) {
  switch (channels) {
    case 1:
      return body(std::integral_constant<int, 1>{});
    case 3:
      return body(std::integral_constant<int, 3>{});
    case 4:
      return body(std::integral_constant<int, 4>{});
    default:
      return body(std::integral_constant<int, 0>{});
  }
}

}  // namespace stoker::transform
