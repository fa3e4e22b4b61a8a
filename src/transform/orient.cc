#include "transform/orient.h"

#include <cstring>

namespace stoker::transform {

OrientedSize Oriented(int width, int height, int orientation) {
  if (orientation >= 5 && orientation <= 8) return {height, width};
  return {width, height};
}

void ApplyOrientation(const ImageView& src, int orientation, std::vector<std::uint8_t>& out) {
  const int w = src.width, h = src.height;
  const OrientedSize size = Oriented(w, h, orientation);
  out.resize(static_cast<std::size_t>(size.width) * size.height * 3);
  if (orientation < 2 || orientation > 8) {
    for (int y = 0; y < h; ++y)
      std::memcpy(out.data() + static_cast<std::size_t>(y) * w * 3, src.data + y * src.stride,
                  static_cast<std::size_t>(w) * 3);
    return;
  }
  // For each output pixel (x, y), the source pixel it comes from.
  for (int y = 0; y < size.height; ++y) {
    std::uint8_t* row = out.data() + static_cast<std::size_t>(y) * size.width * 3;
    for (int x = 0; x < size.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;
        case 3:
          sx = w - 1 - x;
          sy = h - 1 - y;
          break;
        case 4:
          sy = h - 1 - y;
          break;
        case 5:
          sx = y;
          sy = x;
          break;
        case 6:
          sx = y;
          sy = h - 1 - x;
          break;
        case 7:
          sx = w - 1 - y;
          sy = h - 1 - x;
          break;
        case 8:
          sx = w - 1 - y;
          sy = x;
          break;
        default:
          break;
      }
      const std::uint8_t* p = src.data + sy * src.stride + static_cast<std::size_t>(sx) * 3;
      row[3 * x] = p[0];
      row[3 * x + 1] = p[1];
      row[3 * x + 2] = p[2];
    }
  }
}

}  // namespace stoker::transform
