// The one list of augmentation steps: a new step is a class in a steps_*.cc
// file and a line here.
#include <algorithm>
#include <array>

#include <fmt/format.h>

#include "transform/step.h"

namespace stoker::transform {
namespace {

struct Entry {
  std::string_view name;
  Result<std::unique_ptr<Step>> (*make)(StepArgs&);
};

constexpr std::array kSteps = {
    Entry{"RandomHorizontalFlip", MakeHorizontalFlip},
    Entry{"RandomVerticalFlip", MakeVerticalFlip},
    Entry{"Pad", MakePad},
    Entry{"RandomCrop", MakeRandomCrop},
    Entry{"CenterCrop", MakeCenterCrop},
    Entry{"Resize", MakeResize},
    Entry{"RandomRotation", MakeRandomRotation},
    Entry{"RandomAffine", MakeRandomAffine},
    Entry{"ColorJitter", MakeColorJitter},
    Entry{"Grayscale", MakeGrayscale},
    Entry{"RandomGrayscale", MakeRandomGrayscale},
    Entry{"GaussianBlur", MakeGaussianBlur},
    Entry{"RandomErasing", MakeRandomErasing},
    Entry{"RandomApply", MakeRandomApply},
    Entry{"RandomChoice", MakeRandomChoice},
    Entry{"RandAugment", MakeRandAugment},
    Entry{"TrivialAugmentWide", MakeTrivialAugmentWide},
    Entry{"AutoAugment", MakeAutoAugment},
};

}  // namespace

Result<std::unique_ptr<Step>> MakeStep(const TransformStep& step) {
  const auto* entry = std::find_if(kSteps.begin(), kSteps.end(), [&](const Entry& e) { return e.name == step.name; });
  if (entry == kSteps.end()) {
    std::string names;
    for (const auto& e : kSteps) names += fmt::format("{}{}", names.empty() ? "" : ", ", e.name);
    return Status::InvalidArgument(fmt::format("unknown transform step '{}' (stoker compiles: {})", step.name, names));
  }
  StepArgs args(step);
  STOKER_ASSIGN_OR_RETURN(auto made, entry->make(args));
  STOKER_RETURN_IF_ERROR(args.Finish());
  return made;
}

}  // namespace stoker::transform
