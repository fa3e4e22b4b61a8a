// DeviceFinisher with augmentation steps: each sample's crop (or the source
// region its warps read) goes to the GPU with an AugmentDesc for the
// augmentation kernels; what they cannot run runs here first. The sample's
// parameters are drawn exactly as the CPU path draws them (the same streams
// in the same order), so both make the same choices.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "device/augment_plan.h"
#include "device/device_finisher.h"

namespace stoker::device {
Status DeviceFinisher::CheckAugmentation() const {
  const TransformOptions& t = transform_;
  if (!augmentation_.tensor_describes_pixels())
    return Status::Unimplemented(
        "RandomErasing(value=\"random\") does not run in the GPU's augmentation kernels (its noise is drawn in "
        "sequence from the sample's stream): give it a fixed value, or use gpu_preprocess=False");
  if (t.after_normalize.size() > static_cast<std::size_t>(kMaxErases))
    return Status::Unimplemented(
        fmt::format("the GPU's augmentation kernels take at most {} steps after Normalize, "
                    "not {}: use gpu_preprocess=False",
                    kMaxErases, t.after_normalize.size()));
  return Status::Ok();
}

bool DeviceFinisher::resizes_here() const {
  return !augmentation_.after_describes_pixels() ||
         transform_.interpolation != TransformOptions::Interpolation::kBilinear;
}

Status DeviceFinisher::PlaceAugmentedSource(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                            std::byte* buffer, ImageScratch& scratch, Rng& rng, ImageDesc& desc,
                                            AugmentDesc& augment, bool& flip) {
  const TransformOptions& t = transform_;
  const bool none = t.kind == TransformOptions::Kind::kNone;
  const bool cpu_after = resizes_here();
  const transform::Augmentation::Record record;
  DecodedCrop crop;  // what the kernels resample, unless they warp the source themselves
  auto whole = [&crop](const transform::Image& image) {
    crop.view = {image.pixels.data(), image.width, image.height, image.stride()};
    crop.x0 = crop.y0 = 0;
    crop.x1 = image.width;
    crop.y1 = image.height;
  };
  std::optional<PartWarpPlan> planned;
  if (augmentation_.has_before()) {
    STOKER_ASSIGN_OR_RETURN(
        planned, PlanPartWarps(encoded, t, augmentation_, context.seed, context.epoch, context.sample, rng, record));
  }
  if (planned) {
    flip = planned->crop.flip;
    STOKER_RETURN_IF_ERROR(DecodeJpegRegion(encoded, planned->source_roi, 1, scratch));
    if (!cpu_after && KernelWarps(planned->warps, planned->sizes, augment)) {
      // The kernel warps: only the source region travels.
      const codec::DecodedRegion& d = scratch.decoded;
      const codec::Roi& r = planned->source_roi;
      const int x0 = std::max(r.x, d.origin_x), y0 = std::max(r.y, d.origin_y);
      const int x1 = std::min(r.x + r.width, d.origin_x + d.width);
      const int y1 = std::min(r.y + r.height, d.origin_y + d.height);
      const std::uint64_t bytes = static_cast<std::uint64_t>(std::max(0, x1 - x0)) * std::max(0, y1 - y0) * 3;
      std::uint64_t at = 0;
      if (bytes > 0 && Reserve(pixel_used_[context.slot], bytes, pixel_capacity_, at)) {
        const std::size_t row = static_cast<std::size_t>(x1 - x0) * 3;
        std::byte* pixels = buffer + desc_bytes_ + at;
        for (int y = y0; y < y1; ++y)
          std::memcpy(pixels + static_cast<std::size_t>(y - y0) * row,
                      d.pixels.data() + (static_cast<std::size_t>(y - d.origin_y) * d.width + (x0 - d.origin_x)) * 3,
                      row);
        augment.region_x = x0;
        augment.region_y = y0;
        augment.region_width = x1 - x0;
        augment.region_height = y1 - y0;
        augment.crop_x = planned->crop.roi.x;
        augment.crop_y = planned->crop.roi.y;
        desc.offset = at;
        desc.width = planned->crop.roi.width;
        desc.height = planned->crop.roi.height;
        desc.x0 = desc.y0 = 0;
        desc.x1 = static_cast<float>(desc.width);
        desc.y1 = static_cast<float>(desc.height);
        return Status::Ok();
      }
      augment = AugmentDesc{};  // no room: warped here, and resized here too below
    } else if (!cpu_after) {
      cpu_warps_.fetch_add(1, std::memory_order_relaxed);
    }
    DrawPartWarps(*planned, scratch);
    whole(scratch.image);
  } else if (augmentation_.has_before() || none) {
    // Steps before the crop that are no warps (or a draw that is none): on the whole image, here.
    rng = transform::Augmentation::SampleRng(context.seed, context.epoch, context.sample);
    STOKER_RETURN_IF_ERROR(DecodeWholeImage(encoded, t, scratch));
    STOKER_RETURN_IF_ERROR(augmentation_.RunBefore(scratch.image, scratch.step_scratch, rng, record));
    const transform::Image& image = scratch.image;
    if (none) {
      if (image.width != t.width || image.height != t.height)
        return Status::Internal(fmt::format("the steps made a {}x{} image, not the output size {}x{}", image.width,
                                            image.height, t.width, t.height));
      whole(image);
    } else {
      STOKER_ASSIGN_OR_RETURN(CropPlan plan,
                              PlanCrop(image.width, image.height, t, context.seed, context.epoch, context.sample));
      flip = plan.flip;
      crop = CropOf(image, plan);
    }
  } else {
    STOKER_RETURN_IF_ERROR(DecodeCrop(encoded, t, context.seed, context.epoch, context.sample, scratch, crop));
    flip = crop.flip;
  }
  if (!cpu_after) return PlaceCrop(crop, context, buffer, scratch, desc);
  // Steps after the crop without pixel ops: the sample is resized, flipped
  // and stepped here, into its fallback image; the kernels normalise it.
  if (none) {  // already the output's size, as the CPU path takes it
    scratch.resized.assign(scratch.image.pixels.begin(), scratch.image.pixels.end());
  } else {
    STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch));
  }
  transform::Image& image = scratch.image;
  image.width = t.width;
  image.height = t.height;
  image.channels = 3;
  image.pixels.swap(scratch.resized);
  if (flip) {
    transform::TransposeImage(image, transform::Transpose::kFlipLeftRight, scratch.step_scratch);
    std::swap(image, scratch.step_scratch);
    flip = false;
  }
  STOKER_RETURN_IF_ERROR(augmentation_.RunAfter(image, scratch.step_scratch, rng, record));
  cpu_steps_.fetch_add(1, std::memory_order_relaxed);
  PlaceFinished(image.pixels.data(), context, buffer, desc);
  return Status::Ok();
}

Status DeviceFinisher::FinishAugmented(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                       std::byte* buffer, ImageScratch& scratch, pipeline::LoaderCounters& counters) {
  using Clock = std::chrono::steady_clock;
  const TransformOptions& t = transform_;
  const auto t0 = Clock::now();
  ImageDesc desc;
  AugmentDesc augment;
  bool flip = false;
  Rng rng = transform::Augmentation::SampleRng(context.seed, context.epoch, context.sample);
  bool placed = false;
  if (device_decode_ && !augmentation_.has_before() && t.kind != TransformOptions::Kind::kNone && !resizes_here()) {
    Status error;
    if (RouteToDevice(encoded, context, buffer, scratch, error)) {
      STOKER_RETURN_IF_ERROR(error);
      std::memcpy(&desc, buffer + static_cast<std::size_t>(context.index) * sizeof(ImageDesc), sizeof(desc));
      flip = desc.flip != 0;
      placed = true;
    }
  }
  if (!placed)
    STOKER_RETURN_IF_ERROR(PlaceAugmentedSource(encoded, context, buffer, scratch, rng, desc, augment, flip));
  const auto t1 = Clock::now();

  // The steps after the crop and on the tensor, drawn as the CPU draws them.
  const transform::Size out{t.width, t.height};
  const transform::Augmentation::Record record;
  transform::PixelProgram program;
  if (!resizes_here()) STOKER_RETURN_IF_ERROR(augmentation_.PlanAfter(out, rng, record, program));
  STOKER_RETURN_IF_ERROR(augmentation_.PlanTensor(out, rng, record, program));
  STOKER_RETURN_IF_ERROR(DescribeProgram(program, flip, augment));
  desc.flip = 0;  // the final write flips
  std::memcpy(buffer + static_cast<std::size_t>(context.index) * sizeof(ImageDesc), &desc, sizeof(desc));
  std::memcpy(buffer + augment_offset_ + static_cast<std::size_t>(context.index) * sizeof(AugmentDesc), &augment,
              sizeof(augment));
  pipeline::LoaderCounters::Add(counters.decode_ns, t1 - t0);
  pipeline::LoaderCounters::Add(counters.transform_ns, Clock::now() - t1);
  return Status::Ok();
}

}  // namespace stoker::device
