// One augmentation step (torchvision's semantics) as the pipeline runs it:
// parameters drawn from the sample's random stream (or given, to replay),
// then applied. Every step is a small class in a steps_*.cc file, created
// through the registry (step_registry.cc), the one place that lists them.
#pragma once

#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/rng.h"
#include "stoker/augment.h"
#include "stoker/status.h"
#include "stoker/types.h"
#include "transform/image.h"
#include "transform/pixel_ops.h"
#include "transform/warp.h"

namespace stoker::transform {

// The output tensor of one sample, for steps that work after normalisation.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Layout layout = Layout::kNCHW;
  int width = 0, height = 0, channels = 3;
};

class Step {
 public:
  virtual ~Step() = default;
  [[nodiscard]] virtual std::string_view name() const = 0;
  // The names of the values Draw reports, in order.
  [[nodiscard]] virtual std::vector<std::string_view> param_names() const { return {}; }
  // True for steps on the normalised output tensor (RandomErasing).
  [[nodiscard]] virtual bool on_tensor() const { return false; }
  // Whether a parameter may be NaN, meaning "not drawn" (ColorJitter's
  // components left out); otherwise every value must be finite.
  [[nodiscard]] virtual bool allows_absent_values() const { return false; }
  // The size an input of `in` pixels comes out at; nullopt when that
  // depends on the drawn parameters (RandomRotation with expand).
  [[nodiscard]] virtual std::optional<Size> OutputSize(Size in) const { return in; }
  // The size these parameters make of `in` (RandomRotation with expand: its
  // canvas for the drawn angle).
  [[nodiscard]] virtual Size OutputSizeFor(const StepParams&, Size in) const { return OutputSize(in).value_or(in); }
  // Targets that follow the image (boxes, keypoints, masks): steps that move
  // pixels move them the same way; the others leave them as they are.
  // Points are (x, y) pairs in continuous pixel coordinates (the image
  // spans [0, W] x [0, H]).
  virtual void MapPoints(const StepParams&, Size, std::span<double>) const {}
  // A label map (1 channel), moved with nearest-neighbour sampling; pixels
  // from outside the image take `fill`.
  [[nodiscard]] virtual Status ApplyToMask(const StepParams&, Image&, Image&, std::uint8_t) const {
    return Status::Ok();
  }
  // Steps that are one affine warp of the image (rotation, affine, flips)
  // can draw only the part of their output a crop needs, from only the
  // part of their input it reads (WarpAffineRegion).
  struct PartWarp {
    AffineMatrix matrix{};
    Interpolation interpolation = Interpolation::kNearest;
    Fill fill{};
    Size out;
  };
  [[nodiscard]] virtual bool draws_parts() const { return false; }
  // The warp these parameters make; nullopt when this draw is not one (a
  // rotation by a multiple of 90 degrees takes Pillow's transpose).
  [[nodiscard]] virtual std::optional<PartWarp> WarpFor(const StepParams&, Size) const { return std::nullopt; }
  // Draws this sample's parameters for an input of `in` pixels.
  [[nodiscard]] virtual StepParams Draw(Size in, Rng& rng) const = 0;
  // Image steps: transforms `image` (`scratch` is free to use). Corruption
  // when this image cannot take the step (smaller than RandomCrop's size).
  [[nodiscard]] virtual Status Apply(const StepParams& params, Image& image, Image& scratch) const;
  // Tensor steps.
  [[nodiscard]] virtual Status ApplyTensor(const StepParams& params, const TensorView& tensor) const;
  // Puts replayed parameters in this step's order, refusing missing or
  // unknown names.
  [[nodiscard]] virtual Result<StepParams> Canonical(const StepParams& given) const;
  // Draws the parameters (or takes `replay`), applies them, and reports
  // what it used in `used`. Steps holding others (RandomApply,
  // RandomChoice) run their children here, each on the size it receives.
  [[nodiscard]] virtual Status Run(Image& image, Image& scratch, Rng& rng, const StepParams* replay,
                                   StepParams& used) const;
  [[nodiscard]] Status RunTensor(const TensorView& tensor, Rng& rng, const StepParams* replay, StepParams& used) const;

  // For another engine (the GPU's augmentation kernel): whether any drawn
  // parameters of this step can be described as pixel operations.
  [[nodiscard]] virtual bool describes_pixels() const { return false; }
  // Appends what `params` do as pixel operations (or, on the tensor,
  // erasures); a step without them sets program.unsupported. Refuses
  // parameters Apply would refuse.
  [[nodiscard]] virtual Status DescribePixels(const StepParams& params, PixelProgram& program) const;
  // Draws the parameters as Run does (the same use of `rng`, the same
  // checks) for an input of `in` pixels and describes them into `program`
  // instead of applying them.
  [[nodiscard]] virtual Status Plan(Size in, Rng& rng, const StepParams* replay, StepParams& used,
                                    PixelProgram& program) const;

  // Refuses values that are not finite (NaN only where allows_absent_values).
  [[nodiscard]] Status CheckValues(const StepParams& p) const;

 protected:
  [[nodiscard]] StepParams MakeParams(std::vector<double> values) const;
};

// A step's arguments with torchvision's checks; errors name the step and
// the argument. Finish() refuses arguments no step read (a typo).
class StepArgs {
 public:
  explicit StepArgs(const TransformStep& step) : step_(step) {}
  [[nodiscard]] const std::string& step_name() const { return step_.name; }
  [[nodiscard]] const std::vector<TransformStep>& children() const { return step_.children; }
  // Numbers of `name`, nullopt when absent; refuses counts not in `counts`
  // and values that are not finite.
  [[nodiscard]] Result<std::optional<std::vector<double>>> Numbers(std::string_view name,
                                                                   std::initializer_list<std::size_t> counts);
  // One number, `fallback` when absent.
  [[nodiscard]] Result<double> Number(std::string_view name, double fallback);
  // A probability in [0, 1].
  [[nodiscard]] Result<double> Probability(std::string_view name, double fallback);
  // A word argument; empty when absent.
  [[nodiscard]] Result<std::string> Word(std::string_view name);
  [[nodiscard]] Result<Interpolation> InterpolationWord(Interpolation fallback);
  // fill: one number (every channel) or three, each in [0, 255]; truncated as torchvision does for PIL.
  [[nodiscard]] Result<Fill> FillArg(std::string_view name);
  // torchvision's _setup_angle: d >= 0 -> [-d, d]; or [lo, hi] with lo <= hi.
  [[nodiscard]] Result<std::optional<std::array<double, 2>>> Angle(std::string_view name,
                                                                   std::initializer_list<std::size_t> counts);
  // A size: 1 number (square) or 2 (height, width), positive integers.
  [[nodiscard]] Result<std::optional<Size>> SizeArg(std::string_view name);
  [[nodiscard]] Status Error(std::string_view message) const;
  [[nodiscard]] Status Finish() const;

 private:
  const TransformStep& step_;
  std::set<std::string, std::less<>> read_;
};

// Creates a step from its name and arguments (step_registry.cc).
[[nodiscard]] Result<std::unique_ptr<Step>> MakeStep(const TransformStep& step);

// Factories, one per step (steps_*.cc).
Result<std::unique_ptr<Step>> MakeHorizontalFlip(StepArgs& args);
Result<std::unique_ptr<Step>> MakeVerticalFlip(StepArgs& args);
Result<std::unique_ptr<Step>> MakePad(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomCrop(StepArgs& args);
Result<std::unique_ptr<Step>> MakeCenterCrop(StepArgs& args);
Result<std::unique_ptr<Step>> MakeResize(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomRotation(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomAffine(StepArgs& args);
Result<std::unique_ptr<Step>> MakeColorJitter(StepArgs& args);
Result<std::unique_ptr<Step>> MakeGrayscale(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomGrayscale(StepArgs& args);
Result<std::unique_ptr<Step>> MakeGaussianBlur(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomErasing(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomApply(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandomChoice(StepArgs& args);
Result<std::unique_ptr<Step>> MakeRandAugment(StepArgs& args);
Result<std::unique_ptr<Step>> MakeTrivialAugmentWide(StepArgs& args);
Result<std::unique_ptr<Step>> MakeAutoAugment(StepArgs& args);

// No step makes an image of more pixels than this (Pillow's decompression
// bomb limit, 2 x Image.MAX_IMAGE_PIXELS).
inline constexpr std::uint64_t kMaxStepPixels = 178'956'970;

// A mask's fill as a Fill (every channel the same).
[[nodiscard]] inline Fill MaskFill(std::uint8_t fill) {
  return {fill, fill, fill};
}

// Python's round() (half to even) to an int.
[[nodiscard]] inline int RoundHalfEvenInt(double x) {
  return static_cast<int>(std::nearbyint(x));
}

}  // namespace stoker::transform
