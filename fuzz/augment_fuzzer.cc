// Fuzzes the augmentation steps: a small image and a list of steps with
// arguments and replayed parameters taken from the input (any values,
// however odd: huge pads and translations, tiny scales, degenerate crops),
// run through AugmentImage, and the geometry the targets follow. Errors
// are fine; crashes, out-of-bounds reads and undefined behaviour are not.
// Each step that describes itself as pixel ops (for the GPU's augmentation
// kernels) must draw in Plan exactly what it draws in Run, and its ops,
// applied by the kernels' twin, must make Run's image: a trap otherwise.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "device/augment_plan.h"
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

bool SameParams(const stoker::StepParams& a, const stoker::StepParams& b) {
  if (a.name != b.name || a.values.size() != b.values.size() || a.children.size() != b.children.size()) return false;
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    const double x = a.values[i].second, y = b.values[i].second;
    if (a.values[i].first != b.values[i].first || !(x == y || (std::isnan(x) && std::isnan(y)))) return false;
  }
  for (std::size_t i = 0; i < a.children.size(); ++i)
    if (!SameParams(a.children[i], b.children[i])) return false;
  return true;
}

// Plan against Run for one step that keeps the image's size, on the same stream.
void CheckPlanMatchesRun(const stoker::TransformStep& spec, const std::vector<std::uint8_t>& rgb, int width, int height,
                         std::uint64_t seed) {
  auto step = stoker::transform::MakeStep(spec);
  if (!step.ok() || !(*step)->describes_pixels() || (*step)->on_tensor()) return;
  const stoker::transform::Size size{width, height};
  if (!((*step)->OutputSize(size) == std::optional(size))) return;
  stoker::Rng run_rng(seed, 9), plan_rng(seed, 9);
  stoker::transform::Image image, scratch;
  image.width = width;
  image.height = height;
  image.pixels = rgb;
  stoker::StepParams ran, planned;
  stoker::transform::PixelProgram program;
  const bool run_ok = (*step)->Run(image, scratch, run_rng, nullptr, ran).ok();
  const bool plan_ok = (*step)->Plan(size, plan_rng, nullptr, planned, program).ok();
  if (run_ok != plan_ok || !SameParams(ran, planned) || run_rng.Next() != plan_rng.Next() ||
      !program.unsupported.empty())
    __builtin_trap();
  if (!run_ok) return;
  stoker::device::AugmentDesc a;
  if (!stoker::device::DescribeProgram(program, false, a).ok()) return;  // more ops than the kernels take
  std::vector<std::uint8_t> twin = rgb;
  const std::uint64_t n = static_cast<std::uint64_t>(width) * height;
  for (int i = 0; i < a.op_count; ++i) {
    std::uint64_t luma = 0;
    for (std::uint64_t p = 0; p < n; ++p) luma += stoker::device::PillowLuma(twin.data() + p * 3);
    const std::uint8_t mean = stoker::device::ContrastMean(luma, n);
    for (std::uint64_t p = 0; p < n; ++p) stoker::device::ApplyPixelOp(a.ops[i], mean, twin.data() + p * 3);
  }
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < 3; ++c) {
        const int sx = a.flip_left_right ? width - 1 - x : x, sy = a.flip_top_bottom ? height - 1 - y : y;
        if (twin[(static_cast<std::size_t>(sy) * width + sx) * 3 + c] !=
            image.pixels[(static_cast<std::size_t>(y) * width + x) * 3 + c])
          __builtin_trap();
      }
}

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
  for (const auto& step : steps) CheckPlanMatchesRun(step, rgb, width, height, seed);
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
