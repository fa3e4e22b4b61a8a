// Steps that hold others: RandomApply (all or none) and RandomChoice (one,
// optionally weighted), as torchvision.transforms has them.
#include <fmt/format.h>

#include "transform/step.h"

namespace stoker::transform {
namespace {

using Steps = std::vector<std::unique_ptr<Step>>;

Result<Steps> MakeChildren(StepArgs& args) {
  if (args.children().empty()) return args.Error("needs at least one inner step");
  Steps steps;
  for (const auto& child : args.children()) {
    STOKER_ASSIGN_OR_RETURN(auto step, MakeStep(child));
    if (step->on_tensor())
      return args.Error(
          fmt::format("cannot hold {} (it works on the normalised tensor; put it after Normalize)", step->name()));
    steps.push_back(std::move(step));
  }
  return steps;
}

std::optional<Size> ChainSize(const Steps& steps, Size in) {
  std::optional<Size> size = in;
  for (const auto& s : steps) {
    if (!size) return std::nullopt;
    size = s->OutputSize(*size);
  }
  return size;
}

// Targets through the children a container applied, each on the size it received.
void MapThrough(const Steps& steps, std::span<const std::size_t> which, const StepParams& p, Size in,
                std::span<double> xy) {
  for (std::size_t k = 0; k < which.size() && k < p.children.size(); ++k) {
    const Step& step = *steps[which[k]];
    step.MapPoints(p.children[k], in, xy);
    in = step.OutputSizeFor(p.children[k], in);
  }
}

Status MaskThrough(const Steps& steps, std::span<const std::size_t> which, const StepParams& p, Image& mask,
                   Image& scratch, std::uint8_t fill) {
  for (std::size_t k = 0; k < which.size() && k < p.children.size(); ++k)
    STOKER_RETURN_IF_ERROR(steps[which[k]]->ApplyToMask(p.children[k], mask, scratch, fill));
  return Status::Ok();
}

Size SizeThrough(const Steps& steps, std::span<const std::size_t> which, const StepParams& p, Size in) {
  for (std::size_t k = 0; k < which.size() && k < p.children.size(); ++k)
    in = steps[which[k]]->OutputSizeFor(p.children[k], in);
  return in;
}

bool AllDescribe(const Steps& steps) {
  for (const auto& s : steps)
    if (!s->describes_pixels()) return false;
  return true;
}

// The value `key` of replayed params, checked.
Result<double> ReplayValue(const StepParams& given, std::string_view step, std::string_view key) {
  if (given.name != step)
    return Status::InvalidArgument(fmt::format("parameters for {} given to step {}", given.name, step));
  if (given.values.size() != 1 || given.values[0].first != key)
    return Status::InvalidArgument(fmt::format("{} parameters hold '{}' and nothing else", step, key));
  return given.values[0].second;
}

class RandomApply final : public Step {
 public:
  RandomApply(Steps steps, double p) : steps_(std::move(steps)), p_(p) {}
  std::string_view name() const override { return "RandomApply"; }
  std::vector<std::string_view> param_names() const override { return {"applied"}; }
  std::optional<Size> OutputSize(Size in) const override {
    const auto out = ChainSize(steps_, in);
    if (!out || !(*out == in)) return std::nullopt;  // differs between applied and not
    return in;
  }
  StepParams Draw(Size, Rng& rng) const override { return MakeParams({rng.Uniform01() < p_ ? 1.0 : 0.0}); }
  Status Run(Image& image, Image& scratch, Rng& rng, const StepParams* replay, StepParams& used) const override {
    bool applied = false;
    STOKER_RETURN_IF_ERROR(Applied(rng, replay, applied));
    used = MakeParams({applied ? 1.0 : 0.0});
    if (!applied) return Status::Ok();
    used.children.resize(steps_.size());
    for (std::size_t i = 0; i < steps_.size(); ++i)
      STOKER_RETURN_IF_ERROR(
          steps_[i]->Run(image, scratch, rng, replay ? &replay->children[i] : nullptr, used.children[i]));
    return Status::Ok();
  }
  Status Apply(const StepParams&, Image&, Image&) const override {
    return Status::Internal("RandomApply runs through Run");
  }
  bool describes_pixels() const override { return AllDescribe(steps_); }
  Status Plan(Size in, Rng& rng, const StepParams* replay, StepParams& used, PixelProgram& program) const override {
    bool applied = false;
    STOKER_RETURN_IF_ERROR(Applied(rng, replay, applied));
    used = MakeParams({applied ? 1.0 : 0.0});
    if (!applied) return Status::Ok();
    used.children.resize(steps_.size());
    for (std::size_t i = 0; i < steps_.size(); ++i) {
      STOKER_RETURN_IF_ERROR(
          steps_[i]->Plan(in, rng, replay ? &replay->children[i] : nullptr, used.children[i], program));
      in = steps_[i]->OutputSizeFor(used.children[i], in);
    }
    return Status::Ok();
  }
  Size OutputSizeFor(const StepParams& p, Size in) const override { return SizeThrough(steps_, All(p), p, in); }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    MapThrough(steps_, All(p), p, in, xy);
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    return MaskThrough(steps_, All(p), p, mask, scratch, fill);
  }

 private:
  // Whether the children apply: drawn, or replayed (and then checked).
  Status Applied(Rng& rng, const StepParams* replay, bool& applied) const {
    if (replay == nullptr) {
      applied = rng.Uniform01() < p_;
      return Status::Ok();
    }
    STOKER_ASSIGN_OR_RETURN(double v, ReplayValue(*replay, name(), "applied"));
    applied = v != 0;
    if (applied && replay->children.size() != steps_.size())
      return Status::InvalidArgument(fmt::format("RandomApply parameters need {} inner steps' parameters, not {}",
                                                 steps_.size(), replay->children.size()));
    return Status::Ok();
  }
  std::vector<std::size_t> All(const StepParams& p) const {
    std::vector<std::size_t> all;
    if (p.values.empty() || p.values[0].second == 0) return all;
    for (std::size_t i = 0; i < steps_.size(); ++i) all.push_back(i);
    return all;
  }
  Steps steps_;
  double p_;
};

class RandomChoice final : public Step {
 public:
  RandomChoice(Steps steps, std::vector<double> cumulative)
      : steps_(std::move(steps)), cumulative_(std::move(cumulative)) {}
  std::string_view name() const override { return "RandomChoice"; }
  std::vector<std::string_view> param_names() const override { return {"index"}; }
  std::optional<Size> OutputSize(Size in) const override {
    std::optional<Size> common;
    for (const auto& s : steps_) {
      const auto out = s->OutputSize(in);
      if (!out || (common && !(*common == *out))) return std::nullopt;
      common = out;
    }
    return common;
  }
  StepParams Draw(Size, Rng& rng) const override { return MakeParams({static_cast<double>(Pick(rng))}); }
  Status Run(Image& image, Image& scratch, Rng& rng, const StepParams* replay, StepParams& used) const override {
    std::size_t index = 0;
    STOKER_RETURN_IF_ERROR(Choose(rng, replay, index));
    used = MakeParams({static_cast<double>(index)});
    used.children.resize(1);
    return steps_[index]->Run(image, scratch, rng, replay ? &replay->children[0] : nullptr, used.children[0]);
  }
  bool describes_pixels() const override { return AllDescribe(steps_); }
  Status Plan(Size in, Rng& rng, const StepParams* replay, StepParams& used, PixelProgram& program) const override {
    std::size_t index = 0;
    STOKER_RETURN_IF_ERROR(Choose(rng, replay, index));
    used = MakeParams({static_cast<double>(index)});
    used.children.resize(1);
    return steps_[index]->Plan(in, rng, replay ? &replay->children[0] : nullptr, used.children[0], program);
  }
  Status Apply(const StepParams&, Image&, Image&) const override {
    return Status::Internal("RandomChoice runs through Run");
  }
  Size OutputSizeFor(const StepParams& p, Size in) const override { return SizeThrough(steps_, Chosen(p), p, in); }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    MapThrough(steps_, Chosen(p), p, in, xy);
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    return MaskThrough(steps_, Chosen(p), p, mask, scratch, fill);
  }

 private:
  std::vector<std::size_t> Chosen(const StepParams& p) const {
    if (p.values.empty()) return {};
    return {static_cast<std::size_t>(p.values[0].second)};
  }
  // The step to run: drawn, or replayed (and then checked).
  Status Choose(Rng& rng, const StepParams* replay, std::size_t& index) const {
    if (replay == nullptr) {
      index = Pick(rng);
      return Status::Ok();
    }
    STOKER_ASSIGN_OR_RETURN(double v, ReplayValue(*replay, name(), "index"));
    if (!(v >= 0 && v < static_cast<double>(steps_.size()) && v == std::floor(v)))
      return Status::InvalidArgument(fmt::format("RandomChoice index {} is not one of its {} steps", v, steps_.size()));
    index = static_cast<std::size_t>(v);
    if (replay->children.size() != 1)
      return Status::InvalidArgument("RandomChoice parameters need the chosen step's parameters");
    return Status::Ok();
  }
  std::size_t Pick(Rng& rng) const {
    const double u = rng.Uniform01() * cumulative_.back();
    for (std::size_t i = 0; i < cumulative_.size(); ++i)
      if (u < cumulative_[i]) return i;
    return cumulative_.size() - 1;
  }
  Steps steps_;
  std::vector<double> cumulative_;
};

}  // namespace

Result<std::unique_ptr<Step>> MakeRandomApply(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(double p, args.Probability("p", 0.5));
  STOKER_ASSIGN_OR_RETURN(Steps steps, MakeChildren(args));
  return std::unique_ptr<Step>(new RandomApply(std::move(steps), p));
}

Result<std::unique_ptr<Step>> MakeRandomChoice(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(Steps steps, MakeChildren(args));
  STOKER_ASSIGN_OR_RETURN(auto weights, args.Numbers("p", {steps.size()}));
  std::vector<double> cumulative;
  double total = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const double w = weights ? (*weights)[i] : 1.0;
    if (!(w >= 0)) return args.Error(fmt::format("weights must not be negative, not {}", w));
    total += w;
    cumulative.push_back(total);
  }
  if (!(total > 0)) return args.Error("weights must not all be zero");
  return std::unique_ptr<Step>(new RandomChoice(std::move(steps), std::move(cumulative)));
}

}  // namespace stoker::transform
