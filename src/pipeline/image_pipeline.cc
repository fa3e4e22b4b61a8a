#include "pipeline/image_pipeline.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "core/rng.h"

namespace stoker {

Result<CropPlan> PlanCrop(int W, int H, const TransformOptions& t, std::uint64_t seed, std::uint64_t epoch,
                          std::uint64_t sample) {
  const std::uint64_t pixels = static_cast<std::uint64_t>(W) * static_cast<std::uint64_t>(H);
  if (t.max_pixels > 0 && pixels > t.max_pixels)
    return Status::Corruption(fmt::format(
        "image is {}x{} = {:.1f} megapixels, more than the limit of {:.1f} (max_pixels / max_image_pixels; a small "
        "file claiming a huge image is a decompression bomb; raise the limit if the image is genuine)",
        W, H, static_cast<double>(pixels) / 1e6, static_cast<double>(t.max_pixels) / 1e6));
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

Status DecodeCrop(std::span<const std::byte> jpeg, const TransformOptions& t, std::uint64_t seed, std::uint64_t epoch,
                  std::uint64_t sample, ImageScratch& scratch, DecodedCrop& crop) {
  const auto format = codec::DetectImageFormat(jpeg);
  const bool is_jpeg = !format || *format == codec::ImageFormat::kJpeg;  // not an image: JpegSize says why
  STOKER_ASSIGN_OR_RETURN(codec::ImageSize size, is_jpeg ? codec::JpegSize(jpeg) : codec::ImageFileSize(jpeg));
  const int W = size.width, H = size.height;
  STOKER_ASSIGN_OR_RETURN(CropPlan plan, PlanCrop(W, H, t, seed, epoch, sample));
  codec::Roi roi = plan.roi;
  const transform::FloatBox box = plan.box;
  const int crop_w = plan.crop_w, crop_h = plan.crop_h;
  const bool flip = plan.flip;
  int scale = 1;
  if (t.dct_scaling && is_jpeg) {
    while (scale < 8 && crop_w / (scale * 2) >= t.width && crop_h / (scale * 2) >= t.height) scale *= 2;
  }
  if (roi.width > 0) {
    // Decode one iMCU (16 px) beyond the box on each side: chroma upsampling
    // at the edge of a partial decode needs its neighbours, and without them
    // edge pixels would differ from a full decode.
    const int margin = 16 * scale;
    const int left = std::max(0, roi.x - margin), top = std::max(0, roi.y - margin);
    const int right = std::min(W, roi.x + roi.width + margin), bottom = std::min(H, roi.y + roi.height + margin);
    roi = {left, top, right - left, bottom - top};
  }
  STOKER_RETURN_IF_ERROR(is_jpeg ? codec::DecodeJpeg(jpeg, roi, scale, scratch.decoded) : DecodeWhole(jpeg, scratch));

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
  crop.trace = {box.x0, box.y0, box.x1, box.y1, flip, scale, W, H};
  return Status::Ok();
}

Status ResizeCrop(const DecodedCrop& crop, const TransformOptions& t, ImageScratch& scratch) {
  scratch.resized.resize(static_cast<std::size_t>(t.width) * t.height * 3);
  if (!transform::ResampleBilinear(crop.view, crop.x0, crop.y0, crop.x1, crop.y1, t.width, t.height,
                                   scratch.resized.data(), scratch.resample)) {
    return Status::Internal(fmt::format("cannot resample box ({}, {})-({}, {}) of a {}x{} image", crop.x0, crop.y0,
                                        crop.x1, crop.y1, crop.view.width, crop.view.height));
  }
  return Status::Ok();
}

Status DecodeAndTransform(std::span<const std::byte> jpeg, const TransformOptions& t,
                          const transform::OutputWriter& writer, std::uint64_t seed, std::uint64_t epoch,
                          std::uint64_t sample, std::byte* out, ImageScratch& scratch, TransformTrace* trace,
                          std::atomic<std::uint64_t>* decode_ns, std::atomic<std::uint64_t>* transform_ns) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  DecodedCrop crop;
  STOKER_RETURN_IF_ERROR(DecodeCrop(jpeg, t, seed, epoch, sample, scratch, crop));
  const auto t1 = Clock::now();
  STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch));
  writer.Write(scratch.resized.data(), t.width, t.height, crop.flip, out);
  if (trace != nullptr) *trace = crop.trace;
  if (decode_ns) decode_ns->fetch_add(static_cast<std::uint64_t>((t1 - t0).count()), std::memory_order_relaxed);
  if (transform_ns)
    transform_ns->fetch_add(static_cast<std::uint64_t>((Clock::now() - t1).count()), std::memory_order_relaxed);
  return Status::Ok();
}

Result<TransformedImage> TransformImage(std::span<const std::byte> jpeg, const TransformOptions& t, std::uint64_t seed,
                                        std::uint64_t epoch, std::uint64_t sample) {
  transform::OutputWriter writer(t.dtype, t.layout, t.normalize, t.mean, t.std);
  TransformedImage result;
  result.data.resize(static_cast<std::size_t>(t.width) * t.height * 3 * transform::DTypeSize(t.dtype));
  ImageScratch scratch;
  STOKER_RETURN_IF_ERROR(DecodeAndTransform(jpeg, t, writer, seed, epoch, sample, result.data.data(), scratch,
                                            &result.trace, nullptr, nullptr));
  return result;
}

}  // namespace stoker
