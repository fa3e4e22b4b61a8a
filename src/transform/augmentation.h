// The augmentation steps of one TransformOptions, made once per loader:
// steps before the crop (on the decoded image), after the crop and flip (on
// the output-sized image) and after normalisation (on the output tensor).
// Each sample draws from its own stream, so results depend only on (seed,
// epoch, sample), never on the thread or the timing.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <vector>

#include "core/rng.h"
#include "stoker/augment.h"
#include "stoker/loader.h"
#include "transform/step.h"
#include "transform/targets.h"

namespace stoker::transform {

class Augmentation {
 public:
  Augmentation() = default;
  // Refuses unknown steps and arguments, tensor steps outside
  // after_normalize (and image steps in it), steps after the crop that
  // change the size, and (Kind::kNone) steps that do not end at the output
  // size whatever the input.
  [[nodiscard]] static Result<Augmentation> Create(const TransformOptions& t);

  [[nodiscard]] bool empty() const { return before_.empty() && after_.empty() && tensor_.empty(); }
  [[nodiscard]] bool has_before() const { return !before_.empty(); }
  [[nodiscard]] bool has_after() const { return !after_.empty(); }
  [[nodiscard]] bool has_tensor() const { return !tensor_.empty(); }
  [[nodiscard]] std::size_t size() const { return before_.size() + after_.size() + tensor_.size(); }

  // The steps before the crop, and whether each is a warp that can draw
  // only a part of its output (the loader then decodes only what they read).
  [[nodiscard]] const std::vector<std::shared_ptr<const Step>>& before_steps() const { return before_; }
  [[nodiscard]] bool before_draws_parts() const;

  // The sample's stream for its steps (apart from the crop's and flip's).
  [[nodiscard]] static Rng SampleRng(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample);

  // A sample's parameters: to replay (`replay`, one per step in order: before,
  // after, tensor; nullptr draws them) and to report (`used`, may be null).
  // The crop stage's box (x0, y0, x1, y1 in source pixels) and flip may be
  // given too.
  struct Record {
    const std::vector<StepParams>* replay = nullptr;
    std::vector<StepParams>* used = nullptr;
    std::optional<std::array<double, 4>> box;
    std::optional<bool> flip;
    // When set, what the steps did, for targets that follow the image.
    SampleGeometry* geometry = nullptr;
  };
  // Refuses a replay whose count of steps differs from this transform's.
  [[nodiscard]] Status CheckRecord(const Record& record) const;
  [[nodiscard]] Status RunBefore(Image& image, Image& scratch, Rng& rng, const Record& record) const;
  [[nodiscard]] Status RunAfter(Image& image, Image& scratch, Rng& rng, const Record& record) const;
  [[nodiscard]] Status RunTensor(const TensorView& tensor, Rng& rng, const Record& record) const;

  // For an engine that applies pixel ops itself (the GPU's augmentation
  // kernel): whether every step after the crop, and every step on the
  // tensor, can be described as them.
  [[nodiscard]] bool after_describes_pixels() const;
  [[nodiscard]] bool tensor_describes_pixels() const;
  // Draw what RunAfter / RunTensor would (the same parameters from the same
  // stream, recorded the same way) for an output of `out` pixels, and
  // describe them into `program` instead of applying them. PlanTensor
  // refuses an erasure outside `out` (a replayed box), as RunTensor does.
  [[nodiscard]] Status PlanAfter(Size out, Rng& rng, const Record& record, PixelProgram& program) const;
  [[nodiscard]] Status PlanTensor(Size out, Rng& rng, const Record& record, PixelProgram& program) const;

 private:
  using Steps = std::vector<std::shared_ptr<const Step>>;
  [[nodiscard]] Status Run(const Steps& steps, std::size_t first, Image& image, Image& scratch, Rng& rng,
                           const Record& record, std::vector<SampleGeometry::Move>* moves) const;
  Steps before_, after_, tensor_;
};

}  // namespace stoker::transform
