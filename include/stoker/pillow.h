// stoker/pillow.h: which Pillow release stoker's resizes reproduce.
//
// stoker's bilinear and bicubic resizes (RandomResizedCrop's, Resize's, the
// eval crop's) reproduce Pillow's fixed-point arithmetic bit for bit, and
// Pillow rounds to 8 bits between its horizontal and vertical passes, so
// the order of the passes shows in the pixels. Pillow 13 runs the vertical
// pass first when the height shrinks by more pixels than twice the width
// does ((in_h - out_h) > 0 and > 2 (in_w - out_w), the sizes of the image
// being resized: for torchvision's RandomResizedCrop, the crop's); earlier
// releases always run the horizontal pass first. The two orders differ by
// one level on some of such a resize's pixels.
//
// The choice is process-wide; the default is Pillow 13's order. The Python
// package sets it from the installed Pillow when it is imported, so that
// stoker's pixels are those of the torchvision pipeline it replaces.
#pragma once

#include <cstdint>

namespace stoker {

enum class PillowResizeOrder : std::uint8_t {
  kPillow13,  // vertical pass first when the height shrinks most (Pillow >= 13)
  kBefore13,  // horizontal pass first, always (Pillow <= 12)
};

void SetPillowResizeOrder(PillowResizeOrder order);
[[nodiscard]] PillowResizeOrder GetPillowResizeOrder();

}  // namespace stoker
