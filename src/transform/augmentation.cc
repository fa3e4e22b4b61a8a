#include "transform/augmentation.h"

#include <algorithm>

#include <fmt/format.h>

namespace stoker::transform {
namespace {

Status MakeSteps(const std::vector<TransformStep>& specs, bool tensor, std::string_view where,
                 std::vector<std::shared_ptr<const Step>>& out) {
  for (const auto& spec : specs) {
    STOKER_ASSIGN_OR_RETURN(auto step, MakeStep(spec));
    if (step->on_tensor() != tensor)
      return Status::InvalidArgument(
          tensor
              ? fmt::format("{} works on images and cannot come after Normalize", step->name())
              : fmt::format("{} works on the normalised tensor: put it after Normalize (not {})", step->name(), where));
    out.push_back(std::shared_ptr<const Step>(std::move(step)));
  }
  return Status::Ok();
}

}  // namespace

Result<Augmentation> Augmentation::Create(const TransformOptions& t) {
  Augmentation a;
  STOKER_RETURN_IF_ERROR(MakeSteps(t.before_crop, false, "before the crop", a.before_));
  STOKER_RETURN_IF_ERROR(MakeSteps(t.after_crop, false, "after the crop", a.after_));
  STOKER_RETURN_IF_ERROR(MakeSteps(t.after_normalize, true, "after Normalize", a.tensor_));
  const Size out{t.width, t.height};
  for (const auto& step : a.after_) {
    const auto size = step->OutputSize(out);
    if (!size || !(*size == out))
      return Status::InvalidArgument(fmt::format(
          "{} after the crop would change the {}x{} output size (put it before the crop, or size the crop for it)",
          step->name(), out.width, out.height));
  }
  if (t.kind == TransformOptions::Kind::kNone) {
    // Without a crop stage the steps alone must make every image the output size.
    for (const Size probe : {Size{1000, 700}, Size{513, 1331}}) {
      std::optional<Size> size = probe;
      for (const auto& step : a.before_)
        if (size) size = step->OutputSize(*size);
      if (!size || !(*size == out))
        return Status::InvalidArgument(fmt::format(
            "without RandomResizedCrop or Resize + CenterCrop, the steps must end at the output size {}x{} for any "
            "image (end with RandomCrop, CenterCrop or Resize to a fixed size)",
            out.width, out.height));
    }
  }
  return a;
}

bool Augmentation::before_draws_parts() const {
  if (before_.empty()) return false;
  for (const auto& step : before_)
    if (!step->draws_parts()) return false;
  return true;
}

Rng Augmentation::SampleRng(std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample) {
  return Rng(seed ^ 0x6175676d656e7421ull, SplitMix64(epoch) ^ sample);
}

Status Augmentation::Run(const Steps& steps, std::size_t first, Image& image, Image& scratch, Rng& rng,
                         const Record& record, std::vector<SampleGeometry::Move>* moves) const {
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const StepParams* replay = record.replay ? &(*record.replay)[first + i] : nullptr;
    StepParams used;
    const Size in = image.size();
    STOKER_RETURN_IF_ERROR(steps[i]->Run(image, scratch, rng, replay, used));
    if (moves != nullptr) moves->push_back({steps[i].get(), used, in});
    if (record.used) record.used->push_back(std::move(used));
  }
  return Status::Ok();
}

Status Augmentation::CheckRecord(const Record& record) const {
  if (record.replay && record.replay->size() != size())
    return Status::InvalidArgument(
        fmt::format("{} steps' parameters given to replay a transform of {} steps", record.replay->size(), size()));
  return Status::Ok();
}

Status Augmentation::RunBefore(Image& image, Image& scratch, Rng& rng, const Record& record) const {
  return Run(before_, 0, image, scratch, rng, record, record.geometry ? &record.geometry->before : nullptr);
}

Status Augmentation::RunAfter(Image& image, Image& scratch, Rng& rng, const Record& record) const {
  return Run(after_, before_.size(), image, scratch, rng, record, record.geometry ? &record.geometry->after : nullptr);
}

bool Augmentation::after_describes_pixels() const {
  return std::all_of(after_.begin(), after_.end(), [](const auto& s) { return s->describes_pixels(); });
}

bool Augmentation::tensor_describes_pixels() const {
  return std::all_of(tensor_.begin(), tensor_.end(), [](const auto& s) { return s->describes_pixels(); });
}

Status Augmentation::PlanAfter(Size out, Rng& rng, const Record& record, PixelProgram& program) const {
  for (std::size_t i = 0; i < after_.size(); ++i) {
    const StepParams* replay = record.replay ? &(*record.replay)[before_.size() + i] : nullptr;
    StepParams used;
    STOKER_RETURN_IF_ERROR(after_[i]->Plan(out, rng, replay, used, program));
    if (record.geometry != nullptr) record.geometry->after.push_back({after_[i].get(), used, out});
    if (record.used) record.used->push_back(std::move(used));
  }
  return Status::Ok();
}

Status Augmentation::PlanTensor(Size out, Rng& rng, const Record& record, PixelProgram& program) const {
  for (std::size_t i = 0; i < tensor_.size(); ++i) {
    const StepParams* replay = record.replay ? &(*record.replay)[before_.size() + after_.size() + i] : nullptr;
    StepParams used;
    const std::size_t first = program.erases.size();
    STOKER_RETURN_IF_ERROR(tensor_[i]->Plan(out, rng, replay, used, program));
    for (std::size_t e = first; e < program.erases.size(); ++e) {
      const TensorErase& b = program.erases[e];
      if (b.top + b.height > out.height || b.left + b.width > out.width)
        return Status::InvalidArgument(fmt::format("{}: the {}x{} box at ({}, {}) leaves the {}x{} image",
                                                   tensor_[i]->name(), b.width, b.height, b.left, b.top, out.width,
                                                   out.height));
    }
    if (record.used) record.used->push_back(std::move(used));
  }
  return Status::Ok();
}

Status Augmentation::RunTensor(const TensorView& tensor, Rng& rng, const Record& record) const {
  for (std::size_t i = 0; i < tensor_.size(); ++i) {
    const StepParams* replay = record.replay ? &(*record.replay)[before_.size() + after_.size() + i] : nullptr;
    StepParams used;
    STOKER_RETURN_IF_ERROR(tensor_[i]->RunTensor(tensor, rng, replay, used));
    if (record.used) record.used->push_back(std::move(used));
  }
  return Status::Ok();
}

}  // namespace stoker::transform

namespace stoker {

Status CheckTransformStep(const TransformStep& step) {
  return transform::MakeStep(step).status();
}

Result<AugmentedImage> AugmentImage(std::span<const std::uint8_t> rgb, int width, int height,
                                    const std::vector<TransformStep>& steps, std::uint64_t seed, std::uint64_t epoch,
                                    std::uint64_t sample, const std::vector<StepParams>* replay) {
  if (width <= 0 || height <= 0 || width > 65536 || height > 65536 ||
      rgb.size() != static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3)
    return Status::InvalidArgument(
        fmt::format("RGB pixels of a {}x{} image need width * height * 3 bytes, not {}", width, height, rgb.size()));
  if (replay != nullptr && replay->size() != steps.size())
    return Status::InvalidArgument(
        fmt::format("{} steps' parameters given for {} steps", replay->size(), steps.size()));
  transform::Image image, scratch;
  image.width = width;
  image.height = height;
  image.channels = 3;
  image.pixels.assign(rgb.begin(), rgb.end());
  Rng rng = transform::Augmentation::SampleRng(seed, epoch, sample);
  AugmentedImage out;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    STOKER_ASSIGN_OR_RETURN(auto step, transform::MakeStep(steps[i]));
    if (step->on_tensor())
      return Status::InvalidArgument(
          fmt::format("{} works on the normalised tensor: apply it within a Compose, "
                      "after Normalize",
                      step->name()));
    StepParams used;
    STOKER_RETURN_IF_ERROR(step->Run(image, scratch, rng, replay ? &(*replay)[i] : nullptr, used));
    out.steps.push_back(std::move(used));
  }
  out.width = image.width;
  out.height = image.height;
  out.rgb = std::move(image.pixels);
  return out;
}

}  // namespace stoker
