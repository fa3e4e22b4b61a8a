// stoker/augment.h: augmentation steps named and parameterised as in
// torchvision.transforms, compiled into the loader's native pipeline.
//
// A step is a torchvision transform's class name and its arguments, for
// example {"RandomRotation", {{"degrees", {-15, 15}}}, {{"interpolation",
// "bilinear"}}}. The registry (src/transform/step_registry.cc) lists every
// step, its arguments and their checks; an unknown step or argument, or an
// argument out of range, is refused when the loader is created, naming it.
//
// Steps and their arguments (numbers as lists; one number where one is taken):
//   RandomHorizontalFlip  p
//   RandomVerticalFlip    p
//   Pad                   padding (1, 2 or 4: left, top, right, bottom), fill (1 or 3);
//                         words: padding_mode constant|edge|reflect|symmetric
//   RandomCrop            size (1 or 2: height, width), padding, fill, pad_if_needed (0/1);
//                         words: padding_mode
//   CenterCrop            size
//   Resize                size (1: the shorter side, or 2: height, width)
//   RandomRotation        degrees (1: [-d, d], or 2), expand (0/1), center (2), fill;
//                         words: interpolation nearest|bilinear
//   RandomAffine          degrees, translate (2), scale (2), shear (1, 2 or 4), center, fill;
//                         words: interpolation
//   ColorJitter           brightness, contrast, saturation (1: [max(0, 1-v), 1+v], or 2), hue (1: [-v, v], or 2)
//   Grayscale             num_output_channels (3; 1 is refused: batches hold 3 channels)
//   RandomGrayscale       p
//   GaussianBlur          kernel_size (1 or 2, odd), sigma (1 or 2: a range)
//   RandomErasing         p, scale (2), ratio (2), value (1 or 3); words: value "random"
//                         (after normalisation only: it works on the output tensor)
//   RandomApply           p; children: the steps applied together
//   RandomChoice          p (one weight per child, optional); children: one is applied
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "stoker/status.h"

namespace stoker {

struct TransformStep {
  std::string name;                                               // torchvision's class name
  std::vector<std::pair<std::string, std::vector<double>>> args;  // numeric arguments
  std::vector<std::pair<std::string, std::string>> words;         // named choices
  std::vector<TransformStep> children;                            // RandomApply, RandomChoice
};

// What one step drew for one sample (or was given to replay): values named
// by the step's parameter names, and its children's (RandomApply,
// RandomChoice; a child not applied has no values).
struct StepParams {
  std::string name;
  std::vector<std::pair<std::string, double>> values;
  std::vector<StepParams> children;
};

// Checks a step's name and arguments as the loader does at creation
// (InvalidArgument naming the step and the argument).
[[nodiscard]] Status CheckTransformStep(const TransformStep& step);

// Runs image steps (not RandomErasing) on RGB pixels (`height` rows of
// `width` * 3 bytes), drawing each step's parameters from the stream of
// (seed, epoch, sample) the loader uses, or taking them from `replay` (one
// per step). For comparing a step with torchvision's functional op.
struct AugmentedImage {
  std::vector<std::uint8_t> rgb;
  int width = 0, height = 0;
  std::vector<StepParams> steps;
};
[[nodiscard]] Result<AugmentedImage> AugmentImage(std::span<const std::uint8_t> rgb, int width, int height,
                                                  const std::vector<TransformStep>& steps, std::uint64_t seed,
                                                  std::uint64_t epoch, std::uint64_t sample,
                                                  const std::vector<StepParams>* replay);

}  // namespace stoker
