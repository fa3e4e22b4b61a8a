#include "device/device_finisher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

namespace stoker::device {
bool DeviceFinisher::Reserve(std::atomic<std::uint64_t>& used, std::uint64_t bytes, std::uint64_t capacity,
                             std::uint64_t& at) {
  std::uint64_t current = used.load(std::memory_order_relaxed);
  do {
    if (current + bytes > capacity) return false;
  } while (!used.compare_exchange_weak(current, current + bytes, std::memory_order_relaxed));
  at = current;
  return true;
}

DeviceFinisher::DeviceFinisher(const TransformOptions& transform, float input_factor)
    : transform_(transform),
      input_factor_(input_factor),
      image_bytes_(static_cast<std::size_t>(transform.width) * static_cast<std::size_t>(transform.height) * 3) {}

void DeviceFinisher::EnableDeviceDecode(const codec::GpuDecodeCaps& caps, std::size_t bytes_per_sample) {
  device_decode_ = true;
  caps_ = caps;
  decode_bytes_per_sample_ = bytes_per_sample;
}

Status DeviceFinisher::Prepare(std::uint32_t slots, std::uint32_t batch_size) {
  if (!(input_factor_ >= 0 && input_factor_ <= 64))
    return Status::InvalidArgument(fmt::format("device_input_factor {} must be between 0 and 64", input_factor_));
  const TransformOptions& t = transform_;
  // A bicubic resize is the CPU's too (the kernels resample with a triangle
  // filter): it takes the augmentation path, which resizes here.
  augment_ = !t.before_crop.empty() || !t.after_crop.empty() || !t.after_normalize.empty() ||
             t.kind == TransformOptions::Kind::kNone || t.interpolation != TransformOptions::Interpolation::kBilinear;
  if (augment_) {
    STOKER_ASSIGN_OR_RETURN(augmentation_, transform::Augmentation::Create(t));
    STOKER_RETURN_IF_ERROR(CheckAugmentation());
  }
  batch_size_ = batch_size;
  compressed_offset_ = batch_size * sizeof(ImageDesc);
  augment_offset_ = compressed_offset_ + (device_decode_ ? batch_size * sizeof(CompressedImage) : 0);
  const std::size_t tables = augment_offset_ + (augment_ ? batch_size * sizeof(AugmentDesc) : 0);
  desc_bytes_ = (tables + 63) / 64 * 64;
  decode_capacity_ = device_decode_ ? decode_bytes_per_sample_ * batch_size : 0;
  decode_used_ = std::make_unique<std::atomic<std::uint64_t>[]>(slots);
  fallback_bytes_ = image_bytes_ * batch_size;
  // The capacity counts from the start of the pixel area, fallback slots included.
  pixel_capacity_ = fallback_bytes_ + static_cast<std::size_t>(static_cast<double>(image_bytes_) * batch_size *
                                                               static_cast<double>(input_factor_));
  pixel_used_ = std::make_unique<std::atomic<std::uint64_t>[]>(slots);
  return Status::Ok();
}

void DeviceFinisher::BeginBatch(std::uint32_t slot) {
  pixel_used_[slot].store(fallback_bytes_, std::memory_order_relaxed);
  decode_used_[slot].store(0, std::memory_order_relaxed);
}

DeviceDecodeRouting DeviceFinisher::routing() const {
  DeviceDecodeRouting r;
  r.on_hardware = on_hardware_.load(std::memory_order_relaxed);
  r.no_room = no_room_.load(std::memory_order_relaxed);
  MutexLock lock(reasons_mu_);
  r.cpu_reasons = cpu_reasons_;
  return r;
}

bool DeviceFinisher::RouteToDevice(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                                   std::byte* buffer, ImageScratch& scratch, Status& error) {
  auto* table = reinterpret_cast<CompressedImage*>(buffer + compressed_offset_);
  table[context.index] = CompressedImage{};
  auto traits = codec::ReadJpegTraits(encoded);
  // A header that does not parse is decoded on the CPU, whose error names the fault.
  if (!traits.ok()) return false;
  const codec::DecodePlan plan = codec::PlanGpuDecode(*traits, caps_);
  if (plan.route == codec::DecodeRoute::kCpu) {
    MutexLock lock(reasons_mu_);
    ++cpu_reasons_[std::string(plan.reason)];
    return false;
  }
  auto crop = PlanCrop(traits->width, traits->height, transform_, context.seed, context.epoch, context.sample);
  if (!crop.ok()) {
    error = crop.error();
    return true;
  }
  // The whole image, or with a restart table the sub-image of the intervals
  // the crop's region needs (the CPU path's margin around the box: edge
  // pixels then decode as in the whole image).
  std::span<const std::byte> jpeg = encoded;
  int x = 0, y = 0, width = traits->width, height = traits->height;
  // Read in part (read_crop_rows): `encoded` is the JPEG's head, its rows are in the scratch.
  const bool in_part = !scratch.held_rows.empty();
  const codec::HeldJpeg held =
      in_part ? codec::HeldJpeg(encoded, scratch.held_rows, scratch.rows_at) : codec::HeldJpeg(encoded);
  if (!scratch.restarts.empty() && crop->roi.width > 0) {
    const codec::Roi& box = crop->roi;
    const int left = std::max(0, box.x - kRegionMargin), top = std::max(0, box.y - kRegionMargin);
    const int right = std::min(width, box.x + box.width + kRegionMargin);
    const int bottom = std::min(height, box.y + box.height + kRegionMargin);
    const codec::SeekableRegion region = codec::AssembleSeekableRegion(
        held, scratch.restarts, {left, top, right - left, bottom - top}, scratch.seek_stream);
    scratch.seek_use = region.use;
    if (region.use == codec::SeekUse::kUsed) {
      jpeg = scratch.seek_stream;
      x = region.x;
      y = region.y;
      width = region.width;
      height = region.height;
    }
  }
  if (in_part && scratch.seek_use != codec::SeekUse::kUsed) {
    // The rows read do not make the region's stream: the loader reads the JPEG whole and finishes it again.
    scratch.seek_use = codec::SeekUse::kNeedsWhole;
    error = Status::Unavailable("the rows read of the seekable JPEG do not cover the region: read it whole");
    return true;
  }
  // Rows of the image, packed, each image's start 256-byte aligned as the decoders prefer.
  const std::uint64_t decoded = (static_cast<std::uint64_t>(width) * height * 3 + 255) / 256 * 256;
  std::uint64_t at = 0, compressed_at = 0;
  if (!Reserve(decode_used_[context.slot], decoded, decode_capacity_, at) ||
      !Reserve(pixel_used_[context.slot], jpeg.size(), pixel_capacity_, compressed_at)) {
    no_room_.fetch_add(1, std::memory_order_relaxed);
    scratch.seek_use.reset();  // decoded on the CPU, which says how it used the table
    return false;              // (a decode-area reservation made here stays unused)
  }
  std::memcpy(buffer + desc_bytes_ + compressed_at, jpeg.data(), jpeg.size());
  CompressedImage& ref = table[context.index];
  ref.offset = compressed_at;
  ref.length = jpeg.size();
  ref.width = width;
  ref.height = height;
  ref.hardware = plan.route == codec::DecodeRoute::kHardware ? 1 : 0;
  ImageDesc desc;
  desc.source = 1;
  desc.offset = at;
  desc.width = width;
  desc.height = height;
  desc.x0 = static_cast<float>(crop->box.x0 - x);
  desc.y0 = static_cast<float>(crop->box.y0 - y);
  desc.x1 = static_cast<float>(std::min(crop->box.x1 - x, static_cast<double>(width)));
  desc.y1 = static_cast<float>(std::min(crop->box.y1 - y, static_cast<double>(height)));
  desc.flip = crop->flip ? 1 : 0;
  std::memcpy(buffer + static_cast<std::size_t>(context.index) * sizeof(ImageDesc), &desc, sizeof(desc));
  if (ref.hardware) on_hardware_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

std::optional<codec::Roi> DeviceFinisher::PlannedRegion(int width, int height,
                                                        const pipeline::SampleContext& context) const {
  // The CPU path's region (DecodeCrop, margin at its DCT scale) holds the
  // device path's (margin at full scale), so the rows read serve both: a
  // sample with no room on the device is decoded on the CPU from them.
  if (augment_) return std::nullopt;
  return PlannedJpegRegion(width, height, transform_, augmentation_, context.seed, context.epoch, context.sample);
}

std::size_t DeviceFinisher::UsedBytes(std::uint32_t slot, std::uint32_t) const {
  return desc_bytes_ + std::min<std::uint64_t>(pixel_used_[slot].load(), pixel_capacity_);
}

OutputDesc DeviceFinisher::output() const {
  const auto& t = transform_;
  OutputDesc o;
  o.width = t.width;
  o.height = t.height;
  o.type = static_cast<OutputType>(t.dtype);
  o.channels_last = t.layout == Layout::kNHWC ? 1 : 0;
  o.normalize = t.normalize ? 1 : 0;
  for (int c = 0; c < 3; ++c) {
    o.mean[c] = t.mean[c];
    o.inv_std[c] = 1.0f / t.std[c];
  }
  return o;
}

Status DeviceFinisher::Finish(std::span<const std::byte> encoded, const pipeline::SampleContext& context,
                              std::byte* buffer, ImageScratch& scratch, pipeline::LoaderCounters& counters) {
  using Clock = std::chrono::steady_clock;
  const TransformOptions& t = transform_;
  if (augment_) return FinishAugmented(encoded, context, buffer, scratch, counters);
  const auto t0 = Clock::now();
  if (device_decode_) {
    Status error;
    if (RouteToDevice(encoded, context, buffer, scratch, error)) {
      pipeline::LoaderCounters::Add(counters.decode_ns, Clock::now() - t0);  // header parse and copy
      return error;
    }
  }
  DecodedCrop crop;
  STOKER_RETURN_IF_ERROR(DecodeCrop(encoded, t, context.seed, context.epoch, context.sample, scratch, crop));
  const auto t1 = Clock::now();
  ImageDesc desc;
  STOKER_RETURN_IF_ERROR(PlaceCrop(crop, context, buffer, scratch, desc));
  desc.flip = crop.flip ? 1 : 0;
  std::memcpy(buffer + static_cast<std::size_t>(context.index) * sizeof(ImageDesc), &desc, sizeof(desc));
  pipeline::LoaderCounters::Add(counters.decode_ns, t1 - t0);
  pipeline::LoaderCounters::Add(counters.transform_ns, Clock::now() - t1);
  return Status::Ok();
}

Status DeviceFinisher::PlaceCrop(const DecodedCrop& crop, const pipeline::SampleContext& context, std::byte* buffer,
                                 ImageScratch& scratch, ImageDesc& desc) {
  const TransformOptions& t = transform_;
  std::byte* pixels = buffer + desc_bytes_;
  // Only the box's pixels travel: the rectangle of whole pixels it touches.
  const int rx0 = std::max(0, static_cast<int>(std::floor(crop.x0)));
  const int ry0 = std::max(0, static_cast<int>(std::floor(crop.y0)));
  const int rx1 = std::min(crop.view.width, static_cast<int>(std::ceil(crop.x1)));
  const int ry1 = std::min(crop.view.height, static_cast<int>(std::ceil(crop.y1)));
  const std::uint64_t bytes = static_cast<std::uint64_t>(std::max(0, rx1 - rx0)) * std::max(0, ry1 - ry0) * 3;
  std::uint64_t at = 0;
  if (bytes > 0 && Reserve(pixel_used_[context.slot], bytes, pixel_capacity_, at)) {
    const std::size_t row = static_cast<std::size_t>(rx1 - rx0) * 3;
    for (int y = ry0; y < ry1; ++y)
      std::memcpy(pixels + at + static_cast<std::size_t>(y - ry0) * row,
                  crop.view.data + static_cast<std::size_t>(y) * crop.view.stride + static_cast<std::size_t>(rx0) * 3,
                  row);
    desc.offset = at;
    desc.width = rx1 - rx0;
    desc.height = ry1 - ry0;
    desc.x0 = static_cast<float>(crop.x0 - rx0);
    desc.y0 = static_cast<float>(crop.y0 - ry0);
    desc.x1 = static_cast<float>(crop.x1 - rx0);
    desc.y1 = static_cast<float>(crop.y1 - ry0);
  } else {
    // No room left in this batch: resize here into the sample's own
    // output-sized fallback image; the GPU still flips and normalises.
    STOKER_RETURN_IF_ERROR(ResizeCrop(crop, t, scratch));
    fallbacks_.fetch_add(1, std::memory_order_relaxed);
    PlaceFinished(scratch.resized.data(), context, buffer, desc);
  }
  return Status::Ok();
}

void DeviceFinisher::PlaceFinished(const std::uint8_t* rgb, const pipeline::SampleContext& context, std::byte* buffer,
                                   ImageDesc& desc) const {
  const TransformOptions& t = transform_;
  desc.offset = static_cast<std::uint64_t>(context.index) * image_bytes_;
  std::memcpy(buffer + desc_bytes_ + desc.offset, rgb, image_bytes_);
  desc.width = t.width;
  desc.height = t.height;
  desc.x0 = desc.y0 = 0;
  desc.x1 = static_cast<float>(t.width);
  desc.y1 = static_cast<float>(t.height);
}

}  // namespace stoker::device
