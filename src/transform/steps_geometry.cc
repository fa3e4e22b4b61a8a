// The warping steps: RandomRotation and RandomAffine (torchvision.transforms
// on PIL images, through Pillow's engines in warp.cc).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "transform/step.h"

namespace stoker::transform {
namespace {

// ---- RandomRotation ----

// Python's angle % 360.0, as Image.rotate takes it.
double NormalAngle(const StepParams& p) {
  double a = std::fmod(p.values[0].second, 360.0);
  if (a != 0 && a < 0) a += 360.0;
  return a;
}

class RandomRotation final : public Step {
 public:
  RandomRotation(std::array<double, 2> degrees, Interpolation interpolation, bool expand,
                 std::optional<std::array<double, 2>> center, Fill fill)
      : degrees_(degrees), interpolation_(interpolation), expand_(expand), center_(center), fill_(fill) {}
  std::string_view name() const override { return "RandomRotation"; }
  std::vector<std::string_view> param_names() const override { return {"angle"}; }
  std::optional<Size> OutputSize(Size in) const override {
    if (expand_) return std::nullopt;
    return in;
  }
  StepParams Draw(Size, Rng& rng) const override { return MakeParams({rng.Uniform(degrees_[0], degrees_[1])}); }
  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    RotateImage(image, p.values[0].second, interpolation_, expand_, center_, fill_, scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }
  Size OutputSizeFor(const StepParams& p, Size in) const override {
    return expand_ ? PlanRotation(in, NormalAngle(p), true, center_).size : in;
  }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    MapPointsForward(PlanRotation(in, NormalAngle(p), expand_, center_).matrix, xy);
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    RotateImage(mask, p.values[0].second, Interpolation::kNearest, expand_, center_, MaskFill(fill), scratch);
    std::swap(mask, scratch);
    return Status::Ok();
  }
  bool draws_parts() const override { return true; }
  std::optional<PartWarp> WarpFor(const StepParams& p, Size in) const override {
    const double a = NormalAngle(p);
    // Image.rotate's fast paths (transposes) are not warps.
    if (!center_ && (a == 0 || a == 180 || ((a == 90 || a == 270) && (expand_ || in.width == in.height))))
      return std::nullopt;
    const RotationPlan plan = PlanRotation(in, a, expand_, center_);
    return PartWarp{plan.matrix, interpolation_, fill_, plan.size};
  }

 private:
  std::array<double, 2> degrees_;
  Interpolation interpolation_;
  bool expand_;
  std::optional<std::array<double, 2>> center_;
  Fill fill_;
};

// ---- RandomAffine ----

class RandomAffine final : public Step {
 public:
  struct Options {
    std::array<double, 2> degrees{};
    std::optional<std::array<double, 2>> translate, scale;
    std::optional<std::vector<double>> shear;  // 2 (x range) or 4 (x and y ranges)
    Interpolation interpolation = Interpolation::kNearest;
    std::optional<std::array<double, 2>> center;
    Fill fill{};
  };
  explicit RandomAffine(Options o) : o_(std::move(o)) {}
  std::string_view name() const override { return "RandomAffine"; }
  std::vector<std::string_view> param_names() const override {
    return {"angle", "translate_x", "translate_y", "scale", "shear_x", "shear_y"};
  }
  StepParams Draw(Size in, Rng& rng) const override {
    const double angle = rng.Uniform(o_.degrees[0], o_.degrees[1]);
    double tx = 0, ty = 0, scale = 1, shear_x = 0, shear_y = 0;
    if (o_.translate) {
      const double max_dx = (*o_.translate)[0] * in.width, max_dy = (*o_.translate)[1] * in.height;
      tx = RoundHalfEvenInt(rng.Uniform(-max_dx, max_dx));
      ty = RoundHalfEvenInt(rng.Uniform(-max_dy, max_dy));
    }
    if (o_.scale) scale = rng.Uniform((*o_.scale)[0], (*o_.scale)[1]);
    if (o_.shear) {
      shear_x = rng.Uniform((*o_.shear)[0], (*o_.shear)[1]);
      if (o_.shear->size() == 4) shear_y = rng.Uniform((*o_.shear)[2], (*o_.shear)[3]);
    }
    return MakeParams({angle, tx, ty, scale, shear_x, shear_y});
  }
  Status Apply(const StepParams& p, Image& image, Image& scratch) const override {
    return Warp(p, image, scratch, o_.interpolation, o_.fill);
  }
  Status ApplyToMask(const StepParams& p, Image& mask, Image& scratch, std::uint8_t fill) const override {
    return Warp(p, mask, scratch, Interpolation::kNearest, MaskFill(fill));
  }
  void MapPoints(const StepParams& p, Size in, std::span<double> xy) const override {
    if (p.values[3].second > 0) MapPointsForward(Matrix(p, in), xy);
  }
  bool draws_parts() const override { return true; }
  std::optional<PartWarp> WarpFor(const StepParams& p, Size in) const override {
    if (!(p.values[3].second > 0)) return std::nullopt;  // Apply names the bad scale
    return PartWarp{Matrix(p, in), o_.interpolation, o_.fill, in};
  }

 private:
  AffineMatrix Matrix(const StepParams& p, Size in) const {
    const auto v = [&p](int i) { return p.values[static_cast<std::size_t>(i)].second; };
    const std::array<double, 2> center = o_.center.value_or(std::array<double, 2>{in.width * 0.5, in.height * 0.5});
    return InverseAffineMatrix(center, v(0), {v(1), v(2)}, v(3), {v(4), v(5)});
  }
  Status Warp(const StepParams& p, Image& image, Image& scratch, Interpolation interpolation, const Fill& fill) const {
    if (!(p.values[3].second > 0))
      return Status::InvalidArgument(fmt::format("RandomAffine: scale {} must be positive", p.values[3].second));
    WarpAffine(image, Matrix(p, image.size()), interpolation, fill, image.size(), scratch);
    std::swap(image, scratch);
    return Status::Ok();
  }

  Options o_;
};

Result<std::optional<std::array<double, 2>>> Pair(StepArgs& args, std::string_view name) {
  STOKER_ASSIGN_OR_RETURN(auto v, args.Numbers(name, {2}));
  if (!v) return std::optional<std::array<double, 2>>();
  return std::optional<std::array<double, 2>>({(*v)[0], (*v)[1]});
}

}  // namespace

Result<std::unique_ptr<Step>> MakeRandomRotation(StepArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto degrees, args.Angle("degrees", {1, 2}));
  if (!degrees) return args.Error("needs degrees");
  STOKER_ASSIGN_OR_RETURN(auto interpolation, args.InterpolationWord(Interpolation::kNearest));
  STOKER_ASSIGN_OR_RETURN(double expand, args.Number("expand", 0));
  STOKER_ASSIGN_OR_RETURN(auto center, Pair(args, "center"));
  STOKER_ASSIGN_OR_RETURN(Fill fill, args.FillArg("fill"));
  return std::unique_ptr<Step>(new RandomRotation(*degrees, interpolation, expand != 0, center, fill));
}

Result<std::unique_ptr<Step>> MakeRandomAffine(StepArgs& args) {
  RandomAffine::Options o;
  STOKER_ASSIGN_OR_RETURN(auto degrees, args.Angle("degrees", {1, 2}));
  if (!degrees) return args.Error("needs degrees");
  o.degrees = *degrees;
  STOKER_ASSIGN_OR_RETURN(o.translate, Pair(args, "translate"));
  if (o.translate)
    for (double t : *o.translate)
      if (!(t >= 0 && t <= 1))
        return args.Error(fmt::format("translation values should be between 0 and 1, not {}", t));
  STOKER_ASSIGN_OR_RETURN(o.scale, Pair(args, "scale"));
  if (o.scale) {
    for (double s : *o.scale)
      if (!(s > 0)) return args.Error(fmt::format("scale values should be positive, not {}", s));
    if ((*o.scale)[0] > (*o.scale)[1]) return args.Error("scale range must have min <= max");
  }
  STOKER_ASSIGN_OR_RETURN(auto shear, args.Numbers("shear", {1, 2, 4}));
  if (shear) {
    if (shear->size() == 1) {
      if ((*shear)[0] < 0) return args.Error("if shear is a single number, it must be positive");
      shear = std::vector<double>{-(*shear)[0], (*shear)[0]};
    }
    for (std::size_t i = 0; i < shear->size(); i += 2)
      if ((*shear)[i] > (*shear)[i + 1]) return args.Error("shear ranges must have min <= max");
    o.shear = shear;
  }
  STOKER_ASSIGN_OR_RETURN(o.interpolation, args.InterpolationWord(Interpolation::kNearest));
  STOKER_ASSIGN_OR_RETURN(o.center, Pair(args, "center"));
  STOKER_ASSIGN_OR_RETURN(o.fill, args.FillArg("fill"));
  return std::unique_ptr<Step>(new RandomAffine(std::move(o)));
}

}  // namespace stoker::transform
