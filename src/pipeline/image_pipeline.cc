#include "pipeline/image_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "core/rng.h"

namespace stoker {

Status CheckImagePixels(int W, int H, const TransformOptions& t) {
  const std::uint64_t pixels = static_cast<std::uint64_t>(W) * static_cast<std::uint64_t>(H);
  if (t.max_pixels > 0 && pixels > t.max_pixels)
    return Status::Corruption(fmt::format(
        "image is {}x{} = {:.1f} megapixels, more than the limit of {:.1f} (max_pixels / max_image_pixels; a small "
        "file claiming a huge image is a decompression bomb; raise the limit if the image is genuine)",
        W, H, static_cast<double>(pixels) / 1e6, static_cast<double>(t.max_pixels) / 1e6));
  return Status::Ok();
}

Result<CropPlan> PlanCrop(int W, int H, const TransformOptions& t, std::uint64_t seed, std::uint64_t epoch,
                          std::uint64_t sample, const transform::Augmentation::Record* given) {
  STOKER_RETURN_IF_ERROR(CheckImagePixels(W, H, t));
  // Augmentation randomness: a pure function of (seed, epoch, sample), so it
  // does not depend on which thread runs the sample, or when.
  Rng rng(seed ^ 0x5f3759df5f3759dfull, SplitMix64(epoch) ^ sample);
  CropPlan plan;
  plan.crop_w = W;
  plan.crop_h = H;
  if (t.kind == TransformOptions::Kind::kRandomResizedCrop) {
    auto b = transform::RandomResizedCropBox(W, H, t.scale[0], t.scale[1], t.ratio[0], t.ratio[1], rng);
    plan.roi = {b.x, b.y, b.width, b.height};
    plan.box = {static_cast<double>(b.x), static_cast<double>(b.y), static_cast<double>(b.x + b.width),
                static_cast<double>(b.y + b.height)};
    plan.crop_w = b.width;
    plan.crop_h = b.height;
  } else {
    plan.box = transform::ResizeCenterCropBox(W, H, t.resize, t.width, t.height);
    plan.crop_w = static_cast<int>(plan.box.x1 - plan.box.x0);
    plan.crop_h = static_cast<int>(plan.box.y1 - plan.box.y0);
  }
  plan.flip = t.flip_probability > 0 && rng.Uniform01() < t.flip_probability;
  if (given != nullptr && given->flip) plan.flip = *given->flip;
  if (given != nullptr && given->box && t.kind == TransformOptions::Kind::kRandomResizedCrop) {
    const auto [x0, y0, x1, y1] = *given->box;
    const bool whole = x0 == std::floor(x0) && y0 == std::floor(y0) && x1 == std::floor(x1) && y1 == std::floor(y1);
    if (!whole || !(0 <= x0 && x0 < x1 && x1 <= W && 0 <= y0 && y0 < y1 && y1 <= H))
      return Status::InvalidArgument(
          fmt::format("crop box ({}, {}, {}, {}) must be whole pixels inside the {}x{} image", x0, y0, x1, y1, W, H));
    plan.roi = {static_cast<int>(x0), static_cast<int>(y0), static_cast<int>(x1 - x0), static_cast<int>(y1 - y0)};
    plan.box = {x0, y0, x1, y1};
    plan.crop_w = plan.roi.width;
    plan.crop_h = plan.roi.height;
  }
  return plan;
}

namespace {

// PNG and WebP have no region-of-interest decoding: the whole image is
// decoded (after the header's size passed the pixel limit) and converted to
// RGB as Pillow's convert("RGB") does; the crop then reads from it.
Status DecodeWhole(std::span<const std::byte> data, ImageScratch& scratch) {
  STOKER_RETURN_IF_ERROR(codec::DecodeImageFile(data, 0, &scratch.source));
  STOKER_RETURN_IF_ERROR(codec::ConvertToMode(scratch.source, codec::ColorMode::kRGB, &scratch.converted));
  codec::DecodedRegion& d = scratch.decoded;
  d.pixels.swap(scratch.converted.data);
  d.width = d.full.width = scratch.converted.width;
  d.height = d.full.height = scratch.converted.height;
  d.origin_x = d.origin_y = 0;
  d.scale = 1;
  return Status::Ok();
}

}  // namespace

Status DecodeJpegRegion(std::span<const std::byte> jpeg, codec::Roi roi, int scale, ImageScratch& scratch) {
  if (scratch.restarts.empty()) return codec::DecodeJpeg(jpeg, roi, scale, scratch.decoded);
  const codec::HeldJpeg held =
      scratch.held_rows.empty() ? codec::HeldJpeg(jpeg) : codec::HeldJpeg(jpeg, scratch.held_rows, scratch.rows_at);
  STOKER_ASSIGN_OR_RETURN(scratch.seek_use, codec::DecodeJpegSeekable(held, scratch.restarts, roi, scale,
                                                                      scratch.decoded, scratch.seek_stream));
  if (scratch.seek_use == codec::SeekUse::kNeedsWhole)
    return Status::Unavailable("the rows read of the seekable JPEG do not cover the region: read it whole");
  return Status::Ok();
}

RegionToDecode RegionFor(const CropPlan& plan, int W, int H, const TransformOptions& t, bool is_jpeg) {
  RegionToDecode r;
  r.roi = plan.roi;
  if (t.dct_scaling && is_jpeg) {
    while (r.scale < 8 && plan.crop_w / (r.scale * 2) >= t.width && plan.crop_h / (r.scale * 2) >= t.height)
      r.scale *= 2;
  }
  if (r.roi.width > 0) {
    // Decode 4 scaled pixels beyond the box on each side: chroma upsampling
    // at the edge of a partial decode needs its neighbours (one pixel), the
    // resampler reaches one past a fractional box, and without them edge
    // pixels would differ from a full decode (tests/codec/jpeg_restart_test's
    // AMarginOfFourScaledPixelsKeepsTheBoxExact). A wider margin costs
    // decode work: a seekable JPEG's region grows by whole intervals.
    const int margin = kRegionMargin * r.scale;
    const int left = std::max(0, r.roi.x - margin), top = std::max(0, r.roi.y - margin);
    const int right = std::min(W, r.roi.x + r.roi.width + margin);
    const int bottom = std::min(H, r.roi.y + r.roi.height + margin);
    r.roi = {left, top, right - left, bottom - top};
  }
  return r;
}

std::optional<codec::Roi> PlannedJpegRegion(int width, int height, const TransformOptions& t,
                                            const transform::Augmentation& augmentation, std::uint64_t seed,
                                            std::uint64_t epoch, std::uint64_t sample) {
  // DecodeAndTransform's path through DecodeCrop, with no record to replay.
  if (augmentation.has_before() || t.kind == TransformOptions::Kind::kNone) return std::nullopt;
  Result<CropPlan> plan = PlanCrop(width, height, t, seed, epoch, sample);
  if (!plan.ok()) return std::nullopt;
  const RegionToDecode region = RegionFor(*plan, width, height, t, /*is_jpeg=*/true);
  if (region.roi.width <= 0) return std::nullopt;
  return region.roi;
}

Status DecodeCrop(std::span<const std::byte> jpeg, const TransformOptions& t, std::uint64_t seed, std::uint64_t epoch,
                  std::uint64_t sample, ImageScratch& scratch, DecodedCrop& crop,
                  const transform::Augmentation::Record* given) {
  const auto format = codec::DetectImageFormat(jpeg);
  const bool is_jpeg = !format || *format == codec::ImageFormat::kJpeg;  // not an image: JpegSize says why
  STOKER_ASSIGN_OR_RETURN(codec::ImageSize size, is_jpeg ? codec::JpegSize(jpeg) : codec::ImageFileSize(jpeg));
  const int W = size.width, H = size.height;
  STOKER_ASSIGN_OR_RETURN(CropPlan plan, PlanCrop(W, H, t, seed, epoch, sample, given));
  const transform::FloatBox box = plan.box;
  const int crop_w = plan.crop_w, crop_h = plan.crop_h;
  const bool flip = plan.flip;
  const auto [roi, scale] = RegionFor(plan, W, H, t, is_jpeg);
  STOKER_RETURN_IF_ERROR(is_jpeg ? DecodeJpegRegion(jpeg, roi, scale, scratch) : DecodeWhole(jpeg, scratch));

  const auto& d = scratch.decoded;
  const double s = d.scale;
  crop.view = {d.pixels.data(), d.width, d.height, static_cast<std::size_t>(d.width) * 3};
  crop.x0 = (box.x0 - d.origin_x) / s;
  crop.y0 = (box.y0 - d.origin_y) / s;
  crop.x1 = (box.x1 - d.origin_x) / s;
  crop.y1 = (box.y1 - d.origin_y) / s;
  if (t.kind == TransformOptions::Kind::kRandomResizedCrop && scale == 1) {
    // torchvision crops first, so filter taps stop at the crop's edges.
    const int cx = static_cast<int>(crop.x0), cy = static_cast<int>(crop.y0);
    crop.view.data += static_cast<std::size_t>(cy) * crop.view.stride + static_cast<std::size_t>(cx) * 3;
    crop.view.width = crop_w;
    crop.view.height = crop_h;
    crop.x0 = crop.y0 = 0;
    crop.x1 = crop_w;
    crop.y1 = crop_h;
  }
  crop.x1 = std::min(crop.x1, static_cast<double>(crop.view.width));
  crop.y1 = std::min(crop.y1, static_cast<double>(crop.view.height));
  crop.flip = flip;
  crop.trace = {box.x0, box.y0, box.x1, box.y1, flip, scale, W, H, {}};
  return Status::Ok();
}

DecodedCrop CropOf(const transform::Image& image, const CropPlan& plan) {
  DecodedCrop crop;
  crop.view = {image.pixels.data(), image.width, image.height, image.stride()};
  crop.x0 = plan.box.x0;
  crop.y0 = plan.box.y0;
  crop.x1 = std::min(plan.box.x1, static_cast<double>(image.width));
  crop.y1 = std::min(plan.box.y1, static_cast<double>(image.height));
  if (plan.roi.width > 0) {  // torchvision crops first, so filter taps stop at the crop's edges
    crop.view.data +=
        static_cast<std::size_t>(plan.roi.y) * crop.view.stride + static_cast<std::size_t>(plan.roi.x) * 3;
    crop.view.width = plan.roi.width;
    crop.view.height = plan.roi.height;
    crop.x0 = crop.y0 = 0;
    crop.x1 = plan.roi.width;
    crop.y1 = plan.roi.height;
  }
  crop.flip = plan.flip;
  return crop;
}

Status ResizeCrop(const DecodedCrop& crop, const TransformOptions& t, ImageScratch& scratch) {
  scratch.resized.resize(static_cast<std::size_t>(t.width) * t.height * 3);
  const auto filter = t.interpolation == TransformOptions::Interpolation::kBicubic
                          ? transform::ResampleFilter::kBicubic
                          : transform::ResampleFilter::kBilinear;
  if (!transform::Resample(crop.view, crop.x0, crop.y0, crop.x1, crop.y1, t.width, t.height, scratch.resized.data(),
                           scratch.resample, filter)) {
    return Status::Internal(fmt::format("cannot resample box ({}, {})-({}, {}) of a {}x{} image", crop.x0, crop.y0,
                                        crop.x1, crop.y1, crop.view.width, crop.view.height));
  }
  return Status::Ok();
}

namespace {

// The crop stage's part of the record (`source` is the image the crop stage received).
void RecordCrop(const TransformOptions& t, const CropPlan& plan, transform::Size source, transform::SampleGeometry& g) {
  g.out = {t.width, t.height};
  g.flip = plan.flip;
  if (t.kind == TransformOptions::Kind::kRandomResizedCrop) {
    g.crop = transform::SampleGeometry::Crop::kBox;
    g.box = {plan.box.x0, plan.box.y0, plan.box.x1, plan.box.y1};
  } else {
    const auto p = transform::PlanResizeCenterCrop(source.width, source.height, t.resize, t.width, t.height);
    g.crop = transform::SampleGeometry::Crop::kResizeThenCenter;
    g.resized = {p.resized_w, p.resized_h};
    g.crop_left = p.left;
    g.crop_top = p.top;
  }
}

}  // namespace

void RecordPartWarps(const TransformOptions& t, const transform::Augmentation& augmentation, const PartWarpPlan& plan,
                     const transform::Augmentation::Record& record) {
  if (record.geometry != nullptr) {
    transform::SampleGeometry& g = *record.geometry;
    g.Clear();
    g.valid = true;
    g.source = plan.sizes[0];
    const auto& steps = augmentation.before_steps();
    for (std::size_t i = 0; i < steps.size(); ++i) g.before.push_back({steps[i].get(), plan.params[i], plan.sizes[i]});
    RecordCrop(t, plan.crop, plan.sizes.back(), g);
    g.regions = plan.regions;
  }
  if (record.used != nullptr)
    for (const auto& p : plan.params) record.used->push_back(p);
}

Status DecodeWholeImage(std::span<const std::byte> data, const TransformOptions& t, ImageScratch& scratch) {
  const auto format = codec::DetectImageFormat(data);
  const bool is_jpeg = !format || *format == codec::ImageFormat::kJpeg;
  STOKER_ASSIGN_OR_RETURN(codec::ImageSize size, is_jpeg ? codec::JpegSize(data) : codec::ImageFileSize(data));
  STOKER_RETURN_IF_ERROR(CheckImagePixels(size.width, size.height, t));
  if (is_jpeg) {
    STOKER_RETURN_IF_ERROR(codec::DecodeJpeg(data, codec::Roi{}, 1, scratch.decoded));
  } else {
    STOKER_RETURN_IF_ERROR(DecodeWhole(data, scratch));
  }
  auto& d = scratch.decoded;
  scratch.image.width = d.width;
  scratch.image.height = d.height;
  scratch.image.channels = 3;
  scratch.image.pixels.swap(d.pixels);
  return Status::Ok();
}

namespace {

// Steps after the crop, the fused write, steps on the tensor.
Status FinishSample(const TransformOptions& t, const transform::OutputWriter& writer,
                    const transform::Augmentation& augmentation, Rng& rng, bool flip, std::byte* out,
                    ImageScratch& scratch, const transform::Augmentation::Record& record) {
  if (augmentation.has_after()) {
    transform::Image& image = scratch.image;
    image.width = t.width;
    image.height = t.height;
    image.channels = 3;
    image.pixels.swap(scratch.resized);
    if (flip) {  // the flip comes before the steps that follow it
      transform::TransposeImage(image, transform::Transpose::kFlipLeftRight, scratch.step_scratch);
      std::swap(image, scratch.step_scratch);
      flip = false;
    }
    STOKER_RETURN_IF_ERROR(augmentation.RunAfter(image, scratch.step_scratch, rng, record));
    image.pixels.swap(scratch.resized);
  }
  writer.Write(scratch.resized.data(), t.width, t.height, flip, out);
  if (augmentation.has_tensor()) {
    const transform::TensorView view{out, t.dtype, t.layout, t.width, t.height, 3};
    STOKER_RETURN_IF_ERROR(augmentation.RunTensor(view, rng, record));
  }
  return Status::Ok();
}

Result<bool> TransformParts(std::span<const std::byte> data, const TransformOptions& t,
                            const transform::OutputWriter& writer, const transform::Augmentation& augmentation,
                            std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, std::byte* out,
                            ImageScratch& scratch, TransformTrace* trace, std::atomic<std::uint64_t>* decode_ns,
                            std::atomic<std::uint64_t>* transform_ns, const transform::Augmentation::Record& record) {
  using Clock = std::chrono::steady_clock;
  Rng rng = transform::Augmentation::SampleRng(seed, epoch, sample);
  STOKER_ASSIGN_OR_RETURN(std::optional<PartWarpPlan> planned,
                          PlanPartWarps(data, t, augmentation, seed, epoch, sample, rng, record));
  if (!planned) return false;
  const PartWarpPlan& plan = *planned;
  const auto t0 = Clock::now();
  STOKER_RETURN_IF_ERROR(DecodeJpegRegion(data, plan.source_roi, 1, scratch));
  const auto t1 = Clock::now();
  if (decode_ns) decode_ns->fetch_add(static_cast<std::uint64_t>((t1 - t0).count()), std::memory_order_relaxed);
  DrawPartWarps(plan, scratch);
  // scratch.image is now exactly the crop box of the image the steps made.
  const transform::Image& current = scratch.image;
  DecodedCrop crop;
  crop.view = {current.pixels.data(), current.width, current.height, current.stride()};
  crop.x1 = current.width;
  crop.y1 = current.height;
  STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch));
  RecordPartWarps(t, augmentation, plan, record);
  STOKER_RETURN_IF_ERROR(FinishSample(t, writer, augmentation, rng, plan.crop.flip, out, scratch, record));
  if (trace != nullptr) {
    *trace = TransformTrace{plan.crop.box.x0,    plan.crop.box.y0,     plan.crop.box.x1,
                            plan.crop.box.y1,    plan.crop.flip,       1,
                            plan.sizes[0].width, plan.sizes[0].height, {}};
    if (record.used != nullptr) trace->steps = *record.used;
  }
  if (transform_ns)
    transform_ns->fetch_add(static_cast<std::uint64_t>((Clock::now() - t1).count()), std::memory_order_relaxed);
  return true;
}

}  // namespace

Status TransformDecoded(const TransformOptions& t, const transform::OutputWriter& writer,
                        const transform::Augmentation& augmentation, std::uint64_t seed, std::uint64_t epoch,
                        std::uint64_t sample, std::byte* out, ImageScratch& scratch, TransformTrace* trace,
                        const transform::Augmentation::Record& record) {
  STOKER_RETURN_IF_ERROR(augmentation.CheckRecord(record));
  Rng rng = transform::Augmentation::SampleRng(seed, epoch, sample);
  transform::Image& image = scratch.image;
  const int W = image.width, H = image.height;
  if (record.geometry != nullptr) {
    record.geometry->Clear();
    record.geometry->valid = true;
    record.geometry->source = {W, H};
  }
  STOKER_RETURN_IF_ERROR(augmentation.RunBefore(image, scratch.step_scratch, rng, record));
  TransformTrace local;
  TransformTrace& tr = trace != nullptr ? *trace : local;
  tr.source_width = W;
  tr.source_height = H;
  tr.decode_scale = 1;
  bool flip = false;
  if (t.kind == TransformOptions::Kind::kNone) {
    if (image.width != t.width || image.height != t.height)
      return Status::Internal(fmt::format("the steps made a {}x{} image, not the output size {}x{}", image.width,
                                          image.height, t.width, t.height));
    scratch.resized.swap(image.pixels);
    tr.x1 = t.width;
    tr.y1 = t.height;
    if (record.geometry != nullptr) record.geometry->out = {t.width, t.height};
  } else {
    STOKER_ASSIGN_OR_RETURN(CropPlan plan, PlanCrop(image.width, image.height, t, seed, epoch, sample, &record));
    if (record.geometry != nullptr) RecordCrop(t, plan, image.size(), *record.geometry);
    STOKER_RETURN_IF_ERROR(ResizeCrop(CropOf(image, plan), t, scratch));
    flip = plan.flip;
    tr.x0 = plan.box.x0;
    tr.y0 = plan.box.y0;
    tr.x1 = plan.box.x1;
    tr.y1 = plan.box.y1;
  }
  tr.flipped = flip;
  STOKER_RETURN_IF_ERROR(FinishSample(t, writer, augmentation, rng, flip, out, scratch, record));
  if (record.used != nullptr) tr.steps = *record.used;
  return Status::Ok();
}

Status DecodeAndTransform(std::span<const std::byte> jpeg, const TransformOptions& t,
                          const transform::OutputWriter& writer, const transform::Augmentation& augmentation,
                          std::uint64_t seed, std::uint64_t epoch, std::uint64_t sample, std::byte* out,
                          ImageScratch& scratch, TransformTrace* trace, std::atomic<std::uint64_t>* decode_ns,
                          std::atomic<std::uint64_t>* transform_ns, const transform::Augmentation::Record& record) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  auto add = [](std::atomic<std::uint64_t>* counter, Clock::duration d) {
    if (counter) counter->fetch_add(static_cast<std::uint64_t>(d.count()), std::memory_order_relaxed);
  };
  transform::Augmentation::Record with_geometry = record;
  if (scratch.record_geometry && with_geometry.geometry == nullptr) with_geometry.geometry = &scratch.geometry;
  if (augmentation.has_before() && scratch.draw_parts) {
    STOKER_ASSIGN_OR_RETURN(bool drawn, TransformParts(jpeg, t, writer, augmentation, seed, epoch, sample, out, scratch,
                                                       trace, decode_ns, transform_ns, with_geometry));
    if (drawn) return Status::Ok();
  }
  if (augmentation.has_before() || t.kind == TransformOptions::Kind::kNone) {
    STOKER_RETURN_IF_ERROR(DecodeWholeImage(jpeg, t, scratch));
    const auto t1 = Clock::now();
    add(decode_ns, t1 - t0);
    STOKER_RETURN_IF_ERROR(
        TransformDecoded(t, writer, augmentation, seed, epoch, sample, out, scratch, trace, with_geometry));
    add(transform_ns, Clock::now() - t1);
    return Status::Ok();
  }
  STOKER_RETURN_IF_ERROR(augmentation.CheckRecord(record));
  DecodedCrop crop;
  STOKER_RETURN_IF_ERROR(DecodeCrop(jpeg, t, seed, epoch, sample, scratch, crop, &record));
  const auto t1 = Clock::now();
  add(decode_ns, t1 - t0);
  if (with_geometry.geometry != nullptr) {
    transform::SampleGeometry& g = *with_geometry.geometry;
    g.Clear();
    g.valid = true;
    g.source = {crop.trace.source_width, crop.trace.source_height};
    CropPlan plan;
    plan.box = {crop.trace.x0, crop.trace.y0, crop.trace.x1, crop.trace.y1};
    plan.flip = crop.flip;
    RecordCrop(t, plan, g.source, g);
  }
  STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch));
  Rng rng = transform::Augmentation::SampleRng(seed, epoch, sample);
  STOKER_RETURN_IF_ERROR(FinishSample(t, writer, augmentation, rng, crop.flip, out, scratch, with_geometry));
  if (trace != nullptr) {
    *trace = crop.trace;
    if (record.used != nullptr) trace->steps = *record.used;
  }
  add(transform_ns, Clock::now() - t1);
  return Status::Ok();
}

Result<TransformedImage> TransformImage(const TransformInput& input, const TransformOptions& t) {
  STOKER_ASSIGN_OR_RETURN(transform::Augmentation augmentation, transform::Augmentation::Create(t));
  transform::OutputWriter writer(t.dtype, t.layout, t.normalize, t.mean, t.std);
  TransformedImage result;
  result.data.resize(static_cast<std::size_t>(t.width) * t.height * 3 * transform::DTypeSize(t.dtype));
  ImageScratch scratch;
  std::vector<StepParams> used;
  transform::Augmentation::Record record{input.replay, &used, input.box, input.flip};
  if (!input.encoded.empty()) {
    STOKER_RETURN_IF_ERROR(DecodeAndTransform(input.encoded, t, writer, augmentation, input.seed, input.epoch,
                                              input.sample, result.data.data(), scratch, &result.trace, nullptr,
                                              nullptr, record));
    return result;
  }
  if (input.width <= 0 || input.height <= 0 ||
      input.rgb.size() != static_cast<std::size_t>(input.width) * static_cast<std::size_t>(input.height) * 3)
    return Status::InvalidArgument(fmt::format(
        "RGB pixels of a {}x{} image need {} bytes, not {}", input.width, input.height,
        static_cast<std::size_t>(std::max(input.width, 0)) * static_cast<std::size_t>(std::max(input.height, 0)) * 3,
        input.rgb.size()));
  STOKER_RETURN_IF_ERROR(CheckImagePixels(input.width, input.height, t));
  scratch.image.width = input.width;
  scratch.image.height = input.height;
  scratch.image.channels = 3;
  scratch.image.pixels.assign(input.rgb.begin(), input.rgb.end());
  STOKER_RETURN_IF_ERROR(TransformDecoded(t, writer, augmentation, input.seed, input.epoch, input.sample,
                                          result.data.data(), scratch, &result.trace, record));
  return result;
}

Result<TransformedImage> TransformImage(std::span<const std::byte> jpeg, const TransformOptions& t, std::uint64_t seed,
                                        std::uint64_t epoch, std::uint64_t sample) {
  TransformInput input;
  input.encoded = jpeg;
  input.seed = seed;
  input.epoch = epoch;
  input.sample = sample;
  return TransformImage(input, t);
}

}  // namespace stoker
