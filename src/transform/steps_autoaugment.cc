// RandAugment, TrivialAugmentWide and AutoAugment (torchvision.transforms,
// PIL path): each draws operations and magnitudes from torchvision's tables
// and applies them with the same Pillow arithmetic as the single steps.
// Parameters name each slot's operation (an index into kOps), its signed
// magnitude and, for AutoAugment, whether it was applied.
#include <cmath>
#include <numbers>
#include <string>

#include <fmt/format.h>

#include "transform/color.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

enum Op : int {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
  kOpCount
};

// RandAugment's and TrivialAugmentWide's space is the first 14, in this order.
constexpr int kWideOps = 14;

// torch.linspace(start, end, steps)[i] in float32, as torch's scalar path computes it.
double Linspace(double start, double end, int steps, int i) {
  const auto s = static_cast<float>(start), e = static_cast<float>(end);
  if (steps == 1) return s;
  const float step = (e - s) / static_cast<float>(steps - 1);
  const float v = i < steps / 2 ? s + step * static_cast<float>(i) : e - step * static_cast<float>(steps - i - 1);
  return v;
}

// The magnitude table's entry `bin`; `wide` selects TrivialAugmentWide's
// ranges. Returns (magnitude, signed); magnitude-free ops give 0.
std::pair<double, bool> Magnitude(int op, int bins, int bin, bool wide, Size size) {
  const double enhance = wide ? 0.99 : 0.9;
  switch (op) {
    case kShearX:
    case kShearY:
      return {Linspace(0.0, wide ? 0.99 : 0.3, bins, bin), true};
    case kTranslateX:
      return {Linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * size.width, bins, bin), true};
    case kTranslateY:
      return {Linspace(0.0, wide ? 32.0 : 150.0 / 331.0 * size.height, bins, bin), true};
    case kRotate:
      return {Linspace(0.0, wide ? 135.0 : 30.0, bins, bin), true};
    case kBrightness:
    case kColor:
    case kContrast:
    case kSharpness:
      return {Linspace(0.0, enhance, bins, bin), true};
    case kPosterize: {
      // 8 - (arange(bins) / ((bins - 1) / 4 or 6)).round().int(), in float32.
      const auto divisor = static_cast<float>((bins - 1) / (wide ? 6.0 : 4.0));
      return {8 - static_cast<int>(std::nearbyint(static_cast<float>(bin) / divisor)), false};
    }
    case kSolarize:
      return {Linspace(255.0, 0.0, bins, bin), false};
    default:
      return {0.0, false};
  }
}

bool HasMagnitudes(int op) {
  return op != kIdentity && op != kAutoContrast && op != kEqualize && op != kInvert;
}

// torchvision's _apply_op on a PIL image.
Status ApplyOp(int op, double magnitude, Interpolation interpolation, const Fill& fill, Image& image, Image& scratch) {
  constexpr double kRadToDeg = 180.0 / std::numbers::pi;
  auto affine = [&](std::array<double, 2> center, std::array<double, 2> translate, std::array<double, 2> shear) {
    const AffineMatrix m = InverseAffineMatrix(center, 0.0, translate, 1.0, shear);
    WarpAffine(image, m, interpolation, fill, image.size(), scratch);
    std::swap(image, scratch);
  };
  const std::array<double, 2> middle{image.width * 0.5, image.height * 0.5};
  switch (op) {
    case kIdentity:
      return Status::Ok();
    case kShearX:
      affine({0, 0}, {0, 0}, {std::atan(magnitude) * kRadToDeg, 0.0});
      return Status::Ok();
    case kShearY:
      affine({0, 0}, {0, 0}, {0.0, std::atan(magnitude) * kRadToDeg});
      return Status::Ok();
    case kTranslateX:
      affine(middle, {std::trunc(magnitude), 0}, {0, 0});
      return Status::Ok();
    case kTranslateY:
      affine(middle, {0, std::trunc(magnitude)}, {0, 0});
      return Status::Ok();
    case kRotate:
      RotateImage(image, magnitude, interpolation, false, std::nullopt, fill, scratch);
      std::swap(image, scratch);
      return Status::Ok();
    case kBrightness:
      AdjustBrightness(image, 1.0 + magnitude);
      return Status::Ok();
    case kColor:
      AdjustSaturation(image, 1.0 + magnitude);
      return Status::Ok();
    case kContrast:
      AdjustContrast(image, 1.0 + magnitude);
      return Status::Ok();
    case kSharpness:
      AdjustSharpness(image, 1.0 + magnitude, scratch);
      return Status::Ok();
    case kPosterize:
      if (!(magnitude >= 0 && magnitude <= 8))
        return Status::InvalidArgument(fmt::format("Posterize bits {} must be in [0, 8]", magnitude));
      Posterize(image, static_cast<int>(magnitude));
      return Status::Ok();
    case kSolarize:
      Solarize(image, magnitude);
      return Status::Ok();
    case kAutoContrast:
      AutoContrast(image);
      return Status::Ok();
    case kEqualize:
      Equalize(image);
      return Status::Ok();
    case kInvert:
      Invert(image);
      return Status::Ok();
    default:
      return Status::InvalidArgument(fmt::format("operation {} is not one of the {} known", op, int{kOpCount}));
  }
}

// The Pillow matrix of a geometric operation (none for the others).
std::optional<AffineMatrix> OpMatrix(int op, double magnitude, Size size) {
  constexpr double kRadToDeg = 180.0 / std::numbers::pi;
  const std::array<double, 2> middle{size.width * 0.5, size.height * 0.5};
  switch (op) {
    case kShearX:
      return InverseAffineMatrix({0, 0}, 0.0, {0, 0}, 1.0, {std::atan(magnitude) * kRadToDeg, 0.0});
    case kShearY:
      return InverseAffineMatrix({0, 0}, 0.0, {0, 0}, 1.0, {0.0, std::atan(magnitude) * kRadToDeg});
    case kTranslateX:
      return InverseAffineMatrix(middle, 0.0, {std::trunc(magnitude), 0}, 1.0, {0, 0});
    case kTranslateY:
      return InverseAffineMatrix(middle, 0.0, {0, std::trunc(magnitude)}, 1.0, {0, 0});
    case kRotate: {
      double a = std::fmod(magnitude, 360.0);
      if (a != 0 && a < 0) a += 360.0;
      return PlanRotation(size, a, false, std::nullopt).matrix;
    }
    default:
      return std::nullopt;
  }
}

// A sequence of (operation, magnitude, applied) slots.
class OpSequence : public Step {
 public:
  OpSequence(int slots, bool with_applied, Interpolation interpolation, Fill fill)
      : slots_(slots), with_applied_(with_applied), interpolation_(interpolation), fill_(fill) {
    for (int k = 0; k < slots; ++k) {
      names_.push_back(fmt::format("op{}", k));
      names_.push_back(fmt::format("magnitude{}", k));
      if (with_applied) names_.push_back(fmt::format("applied{}", k));
    }
  }
  std::vector<std::string_view> param_names() const override { return {names_.begin(), names_.end()}; }
  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    const std::size_t per = with_applied_ ? 3 : 2;
    for (int k = 0; k < slots_; ++k) {
      const std::size_t at = static_cast<std::size_t>(k) * per;
      const double op = p.values[at].second, magnitude = p.values[at + 1].second;
      if (with_applied_ && p.values[at + 2].second == 0) continue;
      if (!(op >= 0 && op < static_cast<double>(int{kOpCount}) && op == std::floor(op)))
        return Status::InvalidArgument(
            fmt::format("{}: operation {} is not an index of 0..{}", name(), op, int{kOpCount} - 1));
      STOKER_RETURN_IF_ERROR(ApplyOp(static_cast<int>(op), magnitude, interpolation_, fill_, image, scratch));
    }
    return Status::Ok();
  }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    ForEachMove(p, in, [&](const AffineMatrix& m) { MapPointsForward(m, xy); });
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    ForEachMove(p, mask.size(), [&](const AffineMatrix& m) {
      WarpAffine(mask, m, Interpolation::kNearest, {fill, fill, fill}, mask.size(), scratch);
      std::swap(mask, scratch);
    });
    return Status::Ok();
  }

 private:
  // Calls `move` with each applied geometric operation's matrix, in order.
  template <typename Move>
  void ForEachMove(const StepParams& p, Size size, Move move) const {
    const std::size_t per = with_applied_ ? 3 : 2;
    for (int k = 0; k < slots_; ++k) {
      const std::size_t at = static_cast<std::size_t>(k) * per;
      if (at + 1 >= p.values.size() || (with_applied_ && p.values[at + 2].second == 0)) continue;
      const double op = p.values[at].second;
      if (!(op >= 0 && op < static_cast<double>(int{kOpCount}))) continue;
      if (auto m = OpMatrix(static_cast<int>(op), p.values[at + 1].second, size)) move(*m);
    }
  }

  int slots_;
  bool with_applied_;
  Interpolation interpolation_;
  Fill fill_;
  std::vector<std::string> names_;
};

class RandAugment final : public OpSequence {
 public:
  RandAugment(int num_ops, int magnitude, int bins, Interpolation interpolation, Fill fill)
      : OpSequence(num_ops, false, interpolation, fill), num_ops_(num_ops), magnitude_(magnitude), bins_(bins) {}
  std::string_view name() const override { return "RandAugment"; }
  StepParams Draw(Size in, Rng& rng) const override {
    std::vector<double> values;
    for (int k = 0; k < num_ops_; ++k) {
      const int op = static_cast<int>(rng.Below(kWideOps));
      auto [m, is_signed] = Magnitude(op, bins_, magnitude_, false, in);
      if (is_signed && rng.Below(2) == 1) m = -m;
      values.push_back(op);
      values.push_back(m);
    }
    return MakeParams(std::move(values));
  }

 private:
  int num_ops_, magnitude_, bins_;
};

class TrivialAugmentWide final : public OpSequence {
 public:
  TrivialAugmentWide(int bins, Interpolation interpolation, Fill fill)
      : OpSequence(1, false, interpolation, fill), bins_(bins) {}
  std::string_view name() const override { return "TrivialAugmentWide"; }
  StepParams Draw(Size in, Rng& rng) const override {
    const int op = static_cast<int>(rng.Below(kWideOps));
    double m = 0;
    if (HasMagnitudes(op)) {
      const int bin = static_cast<int>(rng.Below(static_cast<std::uint64_t>(bins_)));
      auto [value, is_signed] = Magnitude(op, bins_, bin, true, in);
      m = value;
      if (is_signed && rng.Below(2) == 1) m = -m;
    }
    return MakeParams({static_cast<double>(op), m});
  }

 private:
  int bins_;
};

struct PolicyOp {
  Op op;
  double p;
  int magnitude_bin;  // -1: none
};
using Policy = std::array<PolicyOp, 2>;

const std::vector<Policy>& Policies(std::string_view which) {
  static const std::vector<Policy> imagenet = {
      {{{kPosterize, 0.4, 8}, {kRotate, 0.6, 9}}},    {{{kSolarize, 0.6, 5}, {kAutoContrast, 0.6, -1}}},
      {{{kEqualize, 0.8, -1}, {kEqualize, 0.6, -1}}}, {{{kPosterize, 0.6, 7}, {kPosterize, 0.6, 6}}},
      {{{kEqualize, 0.4, -1}, {kSolarize, 0.2, 4}}},  {{{kEqualize, 0.4, -1}, {kRotate, 0.8, 8}}},
      {{{kSolarize, 0.6, 3}, {kEqualize, 0.6, -1}}},  {{{kPosterize, 0.8, 5}, {kEqualize, 1.0, -1}}},
      {{{kRotate, 0.2, 3}, {kSolarize, 0.6, 8}}},     {{{kEqualize, 0.6, -1}, {kPosterize, 0.4, 6}}},
      {{{kRotate, 0.8, 8}, {kColor, 0.4, 0}}},        {{{kRotate, 0.4, 9}, {kEqualize, 0.6, -1}}},
      {{{kEqualize, 0.0, -1}, {kEqualize, 0.8, -1}}}, {{{kInvert, 0.6, -1}, {kEqualize, 1.0, -1}}},
      {{{kColor, 0.6, 4}, {kContrast, 1.0, 8}}},      {{{kRotate, 0.8, 8}, {kColor, 1.0, 2}}},
      {{{kColor, 0.8, 8}, {kSolarize, 0.8, 7}}},      {{{kSharpness, 0.4, 7}, {kInvert, 0.6, -1}}},
      {{{kShearX, 0.6, 5}, {kEqualize, 1.0, -1}}},    {{{kColor, 0.4, 0}, {kEqualize, 0.6, -1}}},
      {{{kEqualize, 0.4, -1}, {kSolarize, 0.2, 4}}},  {{{kSolarize, 0.6, 5}, {kAutoContrast, 0.6, -1}}},
      {{{kInvert, 0.6, -1}, {kEqualize, 1.0, -1}}},   {{{kColor, 0.6, 4}, {kContrast, 1.0, 8}}},
      {{{kEqualize, 0.8, -1}, {kEqualize, 0.6, -1}}},
  };
  static const std::vector<Policy> cifar10 = {
      {{{kInvert, 0.1, -1}, {kContrast, 0.2, 6}}},         {{{kRotate, 0.7, 2}, {kTranslateX, 0.3, 9}}},
      {{{kSharpness, 0.8, 1}, {kSharpness, 0.9, 3}}},      {{{kShearY, 0.5, 8}, {kTranslateY, 0.7, 9}}},
      {{{kAutoContrast, 0.5, -1}, {kEqualize, 0.9, -1}}},  {{{kShearY, 0.2, 7}, {kPosterize, 0.3, 7}}},
      {{{kColor, 0.4, 3}, {kBrightness, 0.6, 7}}},         {{{kSharpness, 0.3, 9}, {kBrightness, 0.7, 9}}},
      {{{kEqualize, 0.6, -1}, {kEqualize, 0.5, -1}}},      {{{kContrast, 0.6, 7}, {kSharpness, 0.6, 5}}},
      {{{kColor, 0.7, 7}, {kTranslateX, 0.5, 8}}},         {{{kEqualize, 0.3, -1}, {kAutoContrast, 0.4, -1}}},
      {{{kTranslateY, 0.4, 3}, {kSharpness, 0.2, 6}}},     {{{kBrightness, 0.9, 6}, {kColor, 0.2, 8}}},
      {{{kSolarize, 0.5, 2}, {kInvert, 0.0, -1}}},         {{{kEqualize, 0.2, -1}, {kAutoContrast, 0.6, -1}}},
      {{{kEqualize, 0.2, -1}, {kEqualize, 0.6, -1}}},      {{{kColor, 0.9, 9}, {kEqualize, 0.6, -1}}},
      {{{kAutoContrast, 0.8, -1}, {kSolarize, 0.2, 8}}},   {{{kBrightness, 0.1, 3}, {kColor, 0.7, 0}}},
      {{{kSolarize, 0.4, 5}, {kAutoContrast, 0.9, -1}}},   {{{kTranslateY, 0.9, 9}, {kTranslateY, 0.7, 9}}},
      {{{kAutoContrast, 0.9, -1}, {kSolarize, 0.8, 3}}},   {{{kEqualize, 0.8, -1}, {kInvert, 0.1, -1}}},
      {{{kTranslateY, 0.7, 9}, {kAutoContrast, 0.9, -1}}},
  };
  static const std::vector<Policy> svhn = {
      {{{kShearX, 0.9, 4}, {kInvert, 0.2, -1}}},        {{{kShearY, 0.9, 8}, {kInvert, 0.7, -1}}},
      {{{kEqualize, 0.6, -1}, {kSolarize, 0.6, 6}}},    {{{kInvert, 0.9, -1}, {kEqualize, 0.6, -1}}},
      {{{kEqualize, 0.6, -1}, {kRotate, 0.9, 3}}},      {{{kShearX, 0.9, 4}, {kAutoContrast, 0.8, -1}}},
      {{{kShearY, 0.9, 8}, {kInvert, 0.4, -1}}},        {{{kShearY, 0.9, 5}, {kSolarize, 0.2, 6}}},
      {{{kInvert, 0.9, -1}, {kAutoContrast, 0.8, -1}}}, {{{kEqualize, 0.6, -1}, {kRotate, 0.9, 3}}},
      {{{kShearX, 0.9, 4}, {kSolarize, 0.3, 3}}},       {{{kShearY, 0.8, 8}, {kInvert, 0.7, -1}}},
      {{{kEqualize, 0.9, -1}, {kTranslateY, 0.6, 6}}},  {{{kInvert, 0.9, -1}, {kEqualize, 0.6, -1}}},
      {{{kContrast, 0.3, 3}, {kRotate, 0.8, 4}}},       {{{kInvert, 0.8, -1}, {kTranslateY, 0.0, 2}}},
      {{{kShearY, 0.7, 6}, {kSolarize, 0.4, 8}}},       {{{kInvert, 0.6, -1}, {kRotate, 0.8, 4}}},
      {{{kShearY, 0.3, 7}, {kTranslateX, 0.9, 3}}},     {{{kShearX, 0.1, 6}, {kInvert, 0.6, -1}}},
      {{{kSolarize, 0.7, 2}, {kTranslateY, 0.6, 7}}},   {{{kShearY, 0.8, 4}, {kInvert, 0.8, -1}}},
      {{{kShearX, 0.7, 9}, {kTranslateY, 0.8, 3}}},     {{{kShearY, 0.8, 5}, {kAutoContrast, 0.7, -1}}},
      {{{kShearX, 0.7, 2}, {kInvert, 0.1, -1}}},
  };
  if (which == "cifar10") return cifar10;
  if (which == "svhn") return svhn;
  return imagenet;
}

class AutoAugment final : public OpSequence {
 public:
  AutoAugment(const std::vector<Policy>& policies, Interpolation interpolation, Fill fill)
      : OpSequence(2, true, interpolation, fill), policies_(policies) {}
  std::string_view name() const override { return "AutoAugment"; }
  StepParams Draw(Size in, Rng& rng) const override {
    const Policy& policy = policies_[rng.Below(policies_.size())];
    std::vector<double> values;
    for (const PolicyOp& o : policy) {
      const double u = rng.Uniform01();
      const bool sign = rng.Below(2) == 1;
      double m = o.magnitude_bin < 0 ? 0.0 : Magnitude(o.op, 10, o.magnitude_bin, false, in).first;
      if (Magnitude(o.op, 10, 0, false, in).second && !sign) m = -m;
      values.push_back(o.op);
      values.push_back(m);
      values.push_back(u <= o.p ? 1.0 : 0.0);
    }
    return MakeParams(std::move(values));
  }

 private:
  const std::vector<Policy>& policies_;
};

struct FamilyArgs {
  Interpolation interpolation = Interpolation::kNearest;
  Fill fill{0, 0, 0};
};

Result<FamilyArgs> ReadFamilyArgs(StepArgs& args) {
  FamilyArgs f;
  STOKER_ASSIGN_OR_RETURN(f.interpolation, args.InterpolationWord(Interpolation::kNearest));
  STOKER_ASSIGN_OR_RETURN(f.fill, args.FillArg("fill"));
  return f;
}

Result<int> WholeNumber(StepArgs& args, std::string_view name, double fallback, int lo, int hi) {
  STOKER_ASSIGN_OR_RETURN(double v, args.Number(name, fallback));
  if (!(v >= lo && v <= hi && v == std::floor(v)))
    return args.Error(fmt::format("{} must be a whole number in [{}, {}], not {}", name, lo, hi, v));
  return static_cast<int>(v);
}

}  // namespace

Result<std::unique_ptr<Step>> MakeRandAugment(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(int num_ops, WholeNumber(args, "num_ops", 2, 0, 64));
  STOKER_ASSIGN_OR_RETURN(int bins, WholeNumber(args, "num_magnitude_bins", 31, 2, 1000));
  STOKER_ASSIGN_OR_RETURN(int magnitude, WholeNumber(args, "magnitude", 9, 0, 1000));
  if (magnitude >= bins)
    return args.Error(fmt::format("magnitude {} must be below num_magnitude_bins {}", magnitude, bins));
  STOKER_ASSIGN_OR_RETURN(FamilyArgs f, ReadFamilyArgs(args));
  return std::unique_ptr<Step>(new RandAugment(num_ops, magnitude, bins, f.interpolation, f.fill));
}

Result<std::unique_ptr<Step>> MakeTrivialAugmentWide(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(int bins, WholeNumber(args, "num_magnitude_bins", 31, 2, 1000));
  STOKER_ASSIGN_OR_RETURN(FamilyArgs f, ReadFamilyArgs(args));
  return std::unique_ptr<Step>(new TrivialAugmentWide(bins, f.interpolation, f.fill));
}

Result<std::unique_ptr<Step>> MakeAutoAugment(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(std::string policy, args.Word("policy"));
  if (policy.empty()) policy = "imagenet";
  if (policy != "imagenet" && policy != "cifar10" && policy != "svhn")
    return args.Error(fmt::format("policy '{}' must be imagenet, cifar10 or svhn", policy));
  STOKER_ASSIGN_OR_RETURN(FamilyArgs f, ReadFamilyArgs(args));
  return std::unique_ptr<Step>(new AutoAugment(Policies(policy), f.interpolation, f.fill));
}

}  // namespace stoker::transform
