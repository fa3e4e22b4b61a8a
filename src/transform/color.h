// Colour adjustments with Pillow's arithmetic, as torchvision applies them to
// PIL images: ImageEnhance's Brightness, Contrast and Color (a blend with a
// degenerate image in single-precision float, truncated, clipped when
// extrapolating), the hue shift through Pillow's HSV conversion, and
// grayscale by ITU-R 601-2 in Pillow's integer form. RGB images (3 channels);
// a 1-channel image is left as it is by the hue and saturation adjustments.
#pragma once

#include <cstdint>

#include "transform/color_pixel.h"
#include "transform/image.h"

namespace stoker::transform {

// Pillow's luma: (19595 R + 38470 G + 7471 B + 0x8000) >> 16.
[[nodiscard]] inline std::uint8_t Luma(const std::uint8_t* rgb) {
  return PillowLuma(rgb);
}

// Each adjusts `image` in place. Factors as torchvision's adjust_* take them.
void AdjustBrightness(Image& image, double factor);
void AdjustContrast(Image& image, double factor);
void AdjustSaturation(Image& image, double factor);
// hue_factor in [-0.5, 0.5].
void AdjustHue(Image& image, double hue_factor);
// Grayscale with the result in every channel (torchvision's
// rgb_to_grayscale(num_output_channels=3)).
void ToGrayscale(Image& image);

// ImageEnhance.Sharpness: a blend with the image through Pillow's SMOOTH
// 3x3 filter (float arithmetic as Pillow's, borders kept).
void AdjustSharpness(Image& image, double factor, Image& scratch);
// ImageOps, per channel through lookup tables as Pillow builds them.
void Posterize(Image& image, int bits);         // keeps the `bits` high bits, 1..8
void Solarize(Image& image, double threshold);  // inverts values >= threshold
void Invert(Image& image);
void AutoContrast(Image& image);  // each channel stretched to 0..255
void Equalize(Image& image);      // each channel's histogram equalised

}  // namespace stoker::transform
