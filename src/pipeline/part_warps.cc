// Warps before a RandomResizedCrop drawn only where the crop reads them
// (pipeline/image_pipeline.h's PartWarpPlan): the plan from the header's
// size, and the warps of the decoded source region.
#include <algorithm>

#include "pipeline/image_pipeline.h"
#include "transform/warp.h"

namespace stoker {

Result<std::optional<PartWarpPlan>> PlanPartWarps(std::span<const std::byte> data, const TransformOptions& t,
                                                  const transform::Augmentation& augmentation, std::uint64_t seed,
                                                  std::uint64_t epoch, std::uint64_t sample, Rng& rng,
                                                  const transform::Augmentation::Record& record) {
  using Plan = std::optional<PartWarpPlan>;
  if (t.kind != TransformOptions::Kind::kRandomResizedCrop || !augmentation.before_draws_parts()) return Plan();
  const auto format = codec::DetectImageFormat(data);
  if (format && *format != codec::ImageFormat::kJpeg) return Plan();
  STOKER_RETURN_IF_ERROR(augmentation.CheckRecord(record));
  STOKER_ASSIGN_OR_RETURN(codec::ImageSize source, codec::JpegSize(data));
  STOKER_RETURN_IF_ERROR(CheckImagePixels(source.width, source.height, t));
  const auto& steps = augmentation.before_steps();
  const std::size_t n = steps.size();
  PartWarpPlan plan;
  plan.params.resize(n);
  plan.warps.resize(n);
  plan.sizes.resize(n + 1);
  plan.sizes[0] = {source.width, source.height};
  for (std::size_t i = 0; i < n; ++i) {
    if (record.replay != nullptr) {
      STOKER_ASSIGN_OR_RETURN(plan.params[i], steps[i]->Canonical((*record.replay)[i]));
    } else {
      plan.params[i] = steps[i]->Draw(plan.sizes[i], rng);
    }
    STOKER_RETURN_IF_ERROR(steps[i]->CheckValues(plan.params[i]));
    auto warp = steps[i]->WarpFor(plan.params[i], plan.sizes[i]);
    if (!warp || static_cast<std::uint64_t>(warp->out.width) * static_cast<std::uint64_t>(warp->out.height) >
                     transform::kMaxStepPixels)
      return Plan();  // the whole path takes it (and names a canvas over the limit)
    plan.warps[i] = *warp;
    plan.sizes[i + 1] = warp->out;
  }
  STOKER_ASSIGN_OR_RETURN(plan.crop,
                          PlanCrop(plan.sizes[n].width, plan.sizes[n].height, t, seed, epoch, sample, &record));
  plan.regions.resize(n + 1);
  plan.regions[n] = {plan.crop.roi.x, plan.crop.roi.y, plan.crop.roi.width, plan.crop.roi.height};
  for (std::size_t i = n; i-- > 0;) {
    plan.regions[i] = transform::InputRegion(plan.warps[i].matrix, plan.sizes[i], plan.regions[i + 1]);
    if (plan.regions[i].width == 0) return Plan();  // the crop sees only fill: rare, the whole path draws it
  }
  // The source region, with the margin around it that chroma upsampling at
  // its edge needs to see what a whole decode would.
  const transform::Rect& r = plan.regions[0];
  const int m = kRegionMargin;
  const int left = std::max(0, r.x - m), top = std::max(0, r.y - m);
  const int right = std::min(source.width, r.x + r.width + m), bottom = std::min(source.height, r.y + r.height + m);
  plan.source_roi = codec::Roi{left, top, right - left, bottom - top};
  return Plan(std::move(plan));
}

void DrawPartWarps(const PartWarpPlan& plan, ImageScratch& scratch) {
  auto& d = scratch.decoded;
  transform::Image* current = &scratch.image;
  transform::Image* next = &scratch.step_scratch;
  current->width = d.width;
  current->height = d.height;
  current->channels = 3;
  current->pixels.swap(d.pixels);
  int ox = d.origin_x, oy = d.origin_y;
  for (std::size_t i = 0; i < plan.warps.size(); ++i) {
    const auto& w = plan.warps[i];
    transform::WarpAffineRegion(*current, ox, oy, plan.sizes[i], w.matrix, w.interpolation, w.fill, plan.sizes[i + 1],
                                plan.regions[i + 1], *next);
    std::swap(current, next);
    ox = plan.regions[i + 1].x;
    oy = plan.regions[i + 1].y;
  }
  if (current != &scratch.image) std::swap(scratch.image, scratch.step_scratch);
}

}  // namespace stoker
