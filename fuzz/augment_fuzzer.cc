// Fuzzes the augmentation steps: a small image and a list of steps with
// arguments and replayed parameters taken from the input (any values,
// however odd: huge pads and translations, tiny scales, degenerate crops),
// run through AugmentImage, and the geometry the targets follow. Errors
// are fine; crashes, out-of-bounds reads and undefined behaviour are not.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "stoker/augment.h"
#include "transform/step.h"
#include "transform/targets.h"

namespace {

class Bytes {
 public:
  Bytes(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  std::uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  double Number() {
    // Mostly small numbers, sometimes extreme ones.
    const std::uint8_t kind = Byte();
    if (kind < 200) return static_cast<double>(static_cast<std::int8_t>(Byte())) / (kind % 8 + 1);
    std::uint64_t bits = 0;
    for (int i = 0; i < 8; ++i) bits = (bits << 8) | Byte();
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
  bool empty() const { return at_ >= size_; }

 private:
  const std::uint8_t* data_;
  std::size_t size_, at_ = 0;
};

const char* const kSteps[] = {
    "RandomHorizontalFlip", "RandomVerticalFlip", "Pad",         "RandomCrop", "CenterCrop",      "Resize",
    "RandomRotation",       "RandomAffine",       "ColorJitter", "Grayscale",  "RandomGrayscale", "GaussianBlur",
    "RandAugment",          "TrivialAugmentWide", "AutoAugment"};
const char* const kArgs[] = {"p",
                             "padding",
                             "fill",
                             "size",
                             "degrees",
                             "expand",
                             "center",
                             "translate",
                             "scale",
                             "shear",
                             "brightness",
                             "contrast",
                             "saturation",
                             "hue",
                             "kernel_size",
                             "sigma",
                             "num_ops",
                             "magnitude",
                             "num_output_channels",
                             "pad_if_needed"};
const char* const kWords[][2] = {{"interpolation", "bilinear"}, {"interpolation", "nearest"},
                                 {"padding_mode", "reflect"},   {"padding_mode", "symmetric"},
                                 {"padding_mode", "edge"},      {"policy", "svhn"}};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  const int width = 1 + in.Byte() % 48, height = 1 + in.Byte() % 48;
  std::vector<std::uint8_t> rgb(static_cast<std::size_t>(width) * height * 3);
  for (auto& v : rgb) v = in.Byte();
  std::vector<stoker::TransformStep> steps;
  const int count = 1 + in.Byte() % 3;
  for (int s = 0; s < count; ++s) {
    stoker::TransformStep step;
    step.name = kSteps[in.Byte() % std::size(kSteps)];
    const int args = in.Byte() % 4;
    for (int a = 0; a < args; ++a) {
      std::vector<double> values(1 + in.Byte() % 4);
      for (auto& v : values) v = in.Number();
      step.args.emplace_back(kArgs[in.Byte() % std::size(kArgs)], values);
    }
    if (in.Byte() % 3 == 0) {
      const auto& w = kWords[in.Byte() % std::size(kWords)];
      step.words.emplace_back(w[0], w[1]);
    }
    steps.push_back(std::move(step));
  }
  const std::uint64_t seed = in.Byte();
  // Drawn parameters, then the same steps replaying odd ones of the input's.
  auto drawn = stoker::AugmentImage(rgb, width, height, steps, seed, 0, 0, nullptr);
  if (drawn.ok()) {
    std::vector<stoker::StepParams> replay = drawn->steps;
    for (auto& p : replay)
      for (auto& [name, value] : p.values)
        if (in.Byte() % 4 == 0) value = in.Number();
    (void)stoker::AugmentImage(rgb, width, height, steps, seed, 0, 0, &replay);
  }
  return 0;
}
