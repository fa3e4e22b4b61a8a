#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "transform/step.h"

namespace stoker::transform {

Status Step::Apply(const StepParams&, Image&, Image&) const {
  return Status::Internal(fmt::format("{} works on the normalised tensor, not on images", name()));
}

Status Step::ApplyTensor(const StepParams&, const TensorView&) const {
  return Status::Internal(fmt::format("{} works on images, not on the normalised tensor", name()));
}

StepParams Step::MakeParams(std::vector<double> values) const {
  StepParams p;
  p.name = std::string(name());
  const auto names = param_names();
  for (std::size_t i = 0; i < values.size() && i < names.size(); ++i) p.values.emplace_back(names[i], values[i]);
  return p;
}

Result<StepParams> Step::Canonical(const StepParams& given) const {
  if (given.name != name())
    return Status::InvalidArgument(fmt::format("parameters for {} given to step {}", given.name, name()));
  const auto names = param_names();
  StepParams p;
  p.name = given.name;
  for (const auto& [key, value] : given.values) {
    if (std::find(names.begin(), names.end(), key) == names.end())
      return Status::InvalidArgument(
          fmt::format("{} has no parameter '{}' (its parameters: {})", name(), key, fmt::join(names, ", ")));
  }
  for (auto n : names) {
    auto it = std::find_if(given.values.begin(), given.values.end(), [&](const auto& kv) { return kv.first == n; });
    if (it == given.values.end())
      return Status::InvalidArgument(
          fmt::format("{} parameters lack '{}' (give all of: {})", name(), n, fmt::join(names, ", ")));
    p.values.emplace_back(std::string(n), it->second);
  }
  if (!given.children.empty())
    return Status::InvalidArgument(fmt::format("{} takes no inner steps' parameters", name()));
  return p;
}

Status Step::Run(Image& image, Image& scratch, Rng& rng, const StepParams* replay, StepParams& used) const {
  if (replay != nullptr) {
    STOKER_ASSIGN_OR_RETURN(used, Canonical(*replay));
  } else {
    used = Draw(image.size(), rng);
  }
  STOKER_RETURN_IF_ERROR(CheckValues(used));
  // A step may grow the image (Pad, expand, CenterCrop beyond it): never past Pillow's pixel limit.
  const Size out = OutputSizeFor(used, image.size());
  if (static_cast<std::uint64_t>(std::max(out.width, 0)) * static_cast<std::uint64_t>(std::max(out.height, 0)) >
      kMaxStepPixels)
    return Status::Corruption(fmt::format("{} would make a {}x{} image of a {}x{} one, over the limit of {} pixels",
                                          name(), out.width, out.height, image.width, image.height, kMaxStepPixels));
  return Apply(used, image, scratch);
}

Status Step::CheckValues(const StepParams& p) const {
  for (const auto& [key, value] : p.values) {
    if (std::isfinite(value) || (std::isnan(value) && allows_absent_values())) continue;
    return Status::InvalidArgument(fmt::format("{}: parameter '{}' is {}, not a finite number", name(), key, value));
  }
  return Status::Ok();
}

Status Step::RunTensor(const TensorView& tensor, Rng& rng, const StepParams* replay, StepParams& used) const {
  if (replay != nullptr) {
    STOKER_ASSIGN_OR_RETURN(used, Canonical(*replay));
  } else {
    used = Draw({tensor.width, tensor.height}, rng);
  }
  STOKER_RETURN_IF_ERROR(CheckValues(used));
  return ApplyTensor(used, tensor);
}

Status Step::DescribePixels(const StepParams&, PixelProgram& program) const {
  if (program.unsupported.empty()) program.unsupported = name();
  return Status::Ok();
}

Status Step::Plan(Size in, Rng& rng, const StepParams* replay, StepParams& used, PixelProgram& program) const {
  if (replay != nullptr) {
    STOKER_ASSIGN_OR_RETURN(used, Canonical(*replay));
  } else {
    used = Draw(in, rng);
  }
  STOKER_RETURN_IF_ERROR(CheckValues(used));
  return DescribePixels(used, program);
}

Status StepArgs::Error(std::string_view message) const {
  return Status::InvalidArgument(fmt::format("{}: {}", step_.name, message));
}

Result<std::optional<std::vector<double>>> StepArgs::Numbers(std::string_view name,
                                                             std::initializer_list<std::size_t> counts) {
  read_.insert(std::string(name));
  for (const auto& [key, values] : step_.args) {
    if (key != name) continue;
    if (std::find(counts.begin(), counts.end(), values.size()) == counts.end())
      return Error(fmt::format("{} takes {} number(s), not {}", name, fmt::join(counts, " or "), values.size()));
    for (double v : values)
      if (!std::isfinite(v)) return Error(fmt::format("{} must be finite, not {}", name, v));
    return std::optional<std::vector<double>>(values);
  }
  return std::optional<std::vector<double>>();
}

Result<double> StepArgs::Number(std::string_view name, double fallback) {
  STOKER_ASSIGN_OR_RETURN(auto v, Numbers(name, {1}));
  return v ? (*v)[0] : fallback;
}

Result<double> StepArgs::Probability(std::string_view name, double fallback) {
  STOKER_ASSIGN_OR_RETURN(double p, Number(name, fallback));
  if (!(p >= 0.0 && p <= 1.0)) return Error(fmt::format("{} must be a probability in [0, 1], not {}", name, p));
  return p;
}

Result<std::string> StepArgs::Word(std::string_view name) {
  read_.insert(std::string(name));
  for (const auto& [key, value] : step_.words)
    if (key == name) {
      if (value.empty()) return Error(fmt::format("{} must not be empty", name));
      return value;
    }
  return std::string();
}

Result<Interpolation> StepArgs::InterpolationWord(Interpolation fallback) {
  STOKER_ASSIGN_OR_RETURN(auto word, Word("interpolation"));
  if (word.empty()) return fallback;
  if (word == "nearest") return Interpolation::kNearest;
  if (word == "bilinear") return Interpolation::kBilinear;
  return Error(fmt::format("interpolation '{}' is not supported (nearest or bilinear)", word));
}

Result<Fill> StepArgs::FillArg(std::string_view name) {
  STOKER_ASSIGN_OR_RETURN(auto v, Numbers(name, {1, 3}));
  Fill fill{0, 0, 0};
  if (!v) return fill;
  for (double x : *v)
    if (x < 0 || x >= 256) return Error(fmt::format("{} values must be in [0, 255], not {}", name, x));
  for (int c = 0; c < 3; ++c) fill[c] = static_cast<std::uint8_t>((*v)[v->size() == 1 ? 0 : c]);
  return fill;
}

Result<std::optional<std::array<double, 2>>> StepArgs::Angle(std::string_view name,
                                                             std::initializer_list<std::size_t> counts) {
  STOKER_ASSIGN_OR_RETURN(auto v, Numbers(name, counts));
  if (!v) return std::optional<std::array<double, 2>>();
  if (v->size() == 1) {
    if ((*v)[0] < 0) return Error(fmt::format("if {} is a single number, it must be positive, not {}", name, (*v)[0]));
    return std::optional<std::array<double, 2>>({-(*v)[0], (*v)[0]});
  }
  if ((*v)[0] > (*v)[1]) return Error(fmt::format("{} range [{}, {}] must have min <= max", name, (*v)[0], (*v)[1]));
  return std::optional<std::array<double, 2>>({(*v)[0], (*v)[1]});
}

Result<std::optional<Size>> StepArgs::SizeArg(std::string_view name) {
  STOKER_ASSIGN_OR_RETURN(auto v, Numbers(name, {1, 2}));
  if (!v) return std::optional<Size>();
  for (double x : *v)
    if (!(x >= 1 && x <= 65536 && x == std::floor(x)))
      return Error(fmt::format("{} must be positive whole numbers (at most 65536), not {}", name, x));
  const int h = static_cast<int>((*v)[0]), w = static_cast<int>((*v)[v->size() == 1 ? 0 : 1]);
  return std::optional<Size>(Size{w, h});
}

Status StepArgs::Finish() const {
  for (const auto& [key, values] : step_.args)
    if (!read_.contains(key)) return Error(fmt::format("has no argument '{}'", key));
  for (const auto& [key, value] : step_.words)
    if (!read_.contains(key)) return Error(fmt::format("has no argument '{}'", key));
  return Status::Ok();
}

}  // namespace stoker::transform
