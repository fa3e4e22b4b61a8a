// RandomErasing (torchvision.transforms.RandomErasing): a random box of the
// normalised output tensor set to a value, per channel values, or normal
// noise ("random"; drawn from the sample's stream through a recorded seed,
// so a replay gives the same noise).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include <fmt/format.h>

#include "core/half.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

class RandomErasing final : public Step {
 public:
  struct Options {
    double p = 0.5;
    std::array<double, 2> scale{0.02, 0.33}, ratio{0.3, 3.3};
    std::vector<double> value{0.0};  // 1 or 3 values; empty: random
  };
  explicit RandomErasing(Options o) : o_(std::move(o)) {}
  std::string_view name() const override { return "RandomErasing"; }
  bool on_tensor() const override { return true; }
  std::vector<std::string_view> param_names() const override {
    return {"erase", "top", "left", "height", "width", "noise_seed"};
  }
  StepParams Draw(Size in, Rng& rng) const override {
    if (!(rng.Uniform01() < o_.p)) return MakeParams({0, 0, 0, 0, 0, 0});
    const double area = static_cast<double>(in.width) * in.height;
    const double log_lo = std::log(o_.ratio[0]), log_hi = std::log(o_.ratio[1]);
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double erase_area = area * rng.Uniform(o_.scale[0], o_.scale[1]);
      const double aspect = std::exp(rng.Uniform(log_lo, log_hi));
      const int h = RoundHalfEvenInt(std::sqrt(erase_area * aspect));
      const int w = RoundHalfEvenInt(std::sqrt(erase_area / aspect));
      if (!(h < in.height && w < in.width)) continue;
      const auto top = static_cast<double>(rng.IntInclusive(0, in.height - h));
      const auto left = static_cast<double>(rng.IntInclusive(0, in.width - w));
      const double seed = o_.value.empty() ? static_cast<double>(rng.Next() >> 11) : 0.0;
      return MakeParams({1, top, left, static_cast<double>(h), static_cast<double>(w), seed});
    }
    return MakeParams({0, 0, 0, 0, 0, 0});  // torchvision erases nothing after 10 misses
  }
  // Noise ("random") is drawn in sequence from the sample's stream, which
  // another engine cannot split between its threads.
  bool describes_pixels() const override { return !o_.value.empty(); }
  Status DescribePixels(const StepParams& p, PixelProgram& program) const override {
    if (o_.value.empty()) {
      if (program.unsupported.empty()) program.unsupported = name();
      return Status::Ok();
    }
    if (p.values[0].second == 0) return Status::Ok();
    STOKER_RETURN_IF_ERROR(CheckBox(p));
    TensorErase e{static_cast<int>(p.values[1].second),
                  static_cast<int>(p.values[2].second),
                  static_cast<int>(p.values[3].second),
                  static_cast<int>(p.values[4].second),
                  {}};
    for (std::size_t c = 0; c < 3; ++c) e.value[c] = static_cast<float>(o_.value[o_.value.size() == 1 ? 0 : c]);
    program.erases.push_back(e);
    return Status::Ok();
  }
  // `n` values of the tensor from element `at` set to `value`.
  static void FillRow(const TensorView& t, std::size_t at, std::size_t n, float value) {
    switch (t.dtype) {
      case DType::kFloat32:
        std::fill_n(static_cast<float*>(t.data) + at, n, value);
        break;
      case DType::kFloat16:
        std::fill_n(static_cast<std::uint16_t*>(t.data) + at, n, FloatToHalfBits(value));
        break;
      case DType::kBFloat16:
        std::fill_n(static_cast<std::uint16_t*>(t.data) + at, n, FloatToBFloat16Bits(value));
        break;
      case DType::kUint8:
        std::fill_n(static_cast<std::uint8_t*>(t.data) + at, n,
                    static_cast<std::uint8_t>(std::clamp(value, 0.0f, 255.0f)));
        break;
    }
  }

  Status ApplyTensor(const StepParams& p, const TensorView& t) const override {
    const auto v = [&p](int i) { return p.values[static_cast<std::size_t>(i)].second; };
    if (v(0) == 0) return Status::Ok();
    STOKER_RETURN_IF_ERROR(CheckBox(p));
    const int top = static_cast<int>(v(1)), left = static_cast<int>(v(2));
    const int h = static_cast<int>(v(3)), w = static_cast<int>(v(4));
    if (top + h > t.height || left + w > t.width)
      return Status::InvalidArgument(fmt::format("RandomErasing: the {}x{} box at ({}, {}) leaves the {}x{} image", w,
                                                 h, left, top, t.width, t.height));
    Rng noise(static_cast<std::uint64_t>(v(5)), 0x6e6f697365ull);
    auto normal = [&noise] {  // Box-Muller, one value per call
      const double u1 = 1.0 - noise.Uniform01(), u2 = noise.Uniform01();
      return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
    };
    if (!o_.value.empty() && t.layout == Layout::kNCHW) {  // a constant per channel: whole rows at once
      for (int c = 0; c < t.channels; ++c) {
        const auto value = static_cast<float>(o_.value[o_.value.size() == 1 ? 0 : c]);
        for (int y = top; y < top + h; ++y) {
          const std::size_t at = static_cast<std::size_t>(c) * t.width * t.height +
                                 static_cast<std::size_t>(y) * t.width + static_cast<std::size_t>(left);
          FillRow(t, at, static_cast<std::size_t>(w), value);
        }
      }
      return Status::Ok();
    }
    for (int c = 0; c < t.channels; ++c) {
      for (int y = top; y < top + h; ++y) {
        for (int x = left; x < left + w; ++x) {
          const float value = o_.value.empty() ? normal() : static_cast<float>(o_.value[o_.value.size() == 1 ? 0 : c]);
          const std::size_t pixel = static_cast<std::size_t>(y) * t.width + x;
          const std::size_t at = t.layout == Layout::kNCHW ? static_cast<std::size_t>(c) * t.width * t.height + pixel
                                                           : pixel * t.channels + c;
          switch (t.dtype) {
            case DType::kFloat32:
              static_cast<float*>(t.data)[at] = value;
              break;
            case DType::kFloat16:
              static_cast<std::uint16_t*>(t.data)[at] = FloatToHalfBits(value);
              break;
            case DType::kBFloat16:
              static_cast<std::uint16_t*>(t.data)[at] = FloatToBFloat16Bits(value);
              break;
            case DType::kUint8:
              static_cast<std::uint8_t*>(t.data)[at] = static_cast<std::uint8_t>(std::clamp(value, 0.0f, 255.0f));
              break;
          }
        }
      }
    }
    return Status::Ok();
  }

 private:
  Status CheckBox(const StepParams& p) const {
    const auto v = [&p](int i) { return p.values[static_cast<std::size_t>(i)].second; };
    for (int i = 1; i <= 5; ++i)
      if (!(v(i) >= 0 && v(i) <= 9007199254740992.0 && v(i) == std::floor(v(i))))
        return Status::InvalidArgument(fmt::format("RandomErasing: {} must be a whole number >= 0, not {}",
                                                   param_names()[static_cast<std::size_t>(i)], v(i)));
    for (int i = 1; i <= 4; ++i)
      if (v(i) > 65536) return Status::InvalidArgument("RandomErasing: the box leaves the image");
    return Status::Ok();
  }
  Options o_;
};

}  // namespace

Result<std::unique_ptr<Step>> MakeRandomErasing(StepArgs& args) {
  RandomErasing::Options o;
  STOKER_ASSIGN_OR_RETURN(o.p, args.Probability("p", 0.5));
  STOKER_ASSIGN_OR_RETURN(auto scale, args.Numbers("scale", {2}));
  if (scale) o.scale = {(*scale)[0], (*scale)[1]};
  if (!(o.scale[0] >= 0 && o.scale[1] <= 1 && o.scale[0] <= o.scale[1]))
    return args.Error(
        fmt::format("scale should be between 0 and 1 with min <= max, not [{}, {}]", o.scale[0], o.scale[1]));
  STOKER_ASSIGN_OR_RETURN(auto ratio, args.Numbers("ratio", {2}));
  if (ratio) o.ratio = {(*ratio)[0], (*ratio)[1]};
  if (!(o.ratio[0] > 0 && o.ratio[0] <= o.ratio[1]))
    return args.Error(fmt::format("ratio should be positive with min <= max, not [{}, {}]", o.ratio[0], o.ratio[1]));
  STOKER_ASSIGN_OR_RETURN(auto value, args.Numbers("value", {1, 3}));
  STOKER_ASSIGN_OR_RETURN(auto word, args.Word("value"));
  if (value && !word.empty()) return args.Error("value is a number, three numbers, or \"random\"; not both");
  if (!word.empty() && word != "random")
    return args.Error(fmt::format("value '{}' must be a number or \"random\"", word));
  if (!word.empty()) o.value.clear();
  if (value) o.value = *value;
  return std::unique_ptr<Step>(new RandomErasing(std::move(o)));
}

}  // namespace stoker::transform
