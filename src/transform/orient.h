// Turning pixels the way an EXIF orientation says (TIFF tag 274), as
// Pillow's ImageOps.exif_transpose does.
#pragma once

#include <cstdint>
#include <vector>

#include "transform/resample.h"

namespace stoker::transform {

// The size of `width` x `height` pixels once turned: orientations 5-8 swap
// the sides.
struct OrientedSize {
  int width = 0;
  int height = 0;
};
[[nodiscard]] OrientedSize Oriented(int width, int height, int orientation);

// Writes `src` turned by `orientation` (1-8; anything else is 1) to `out`
// as tightly packed RGB rows: 2 mirrors left-right, 3 turns 180 degrees, 4
// mirrors top-bottom, 5 transposes, 6 turns 90 degrees clockwise, 7
// transverses, 8 turns 90 degrees anticlockwise.
void ApplyOrientation(const ImageView& src, int orientation, std::vector<std::uint8_t>& out);

}  // namespace stoker::transform
