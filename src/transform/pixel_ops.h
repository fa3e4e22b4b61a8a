// A sample's drawn steps after the crop, and on the tensor, described as
// operations another engine applies (the GPU's augmentation kernel,
// device/augment_math.h), instead of being applied here. Each kind has the
// arithmetic of the CPU step it comes from (transform/color.h), so the
// engine's result is the CPU's. Flips are pixel permutations: every other
// kind is per pixel (contrast reads the whole image's mean, which a
// permutation keeps), so an engine may apply all flips at the end.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

namespace stoker::transform {

struct PixelOp {
  enum class Kind : std::uint8_t {
    kBrightness,  // AdjustBrightness(factor)
    kContrast,    // AdjustContrast(factor)
    kSaturation,  // AdjustSaturation(factor)
    kHue,         // AdjustHue(factor)
    kGrayscale,   // ToGrayscale
    kFlipLeftRight,
    kFlipTopBottom,
  };
  Kind kind = Kind::kBrightness;
  double factor = 1;
};

// RandomErasing's drawn box on the output tensor, with its value per channel.
struct TensorErase {
  int top = 0, left = 0, height = 0, width = 0;
  std::array<float, 3> value{};
};

struct PixelProgram {
  std::vector<PixelOp> ops;         // after the crop, in order
  std::vector<TensorErase> erases;  // on the tensor, in order
  // The first step drawn that no pixel op describes (empty: all are
  // described); the engine cannot run this sample's steps after the crop.
  std::string_view unsupported;
};

}  // namespace stoker::transform
