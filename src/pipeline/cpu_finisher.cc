#include "pipeline/cpu_finisher.h"

namespace stoker::pipeline {

CpuFinisher::CpuFinisher(const TransformOptions& t)
    : transform_(t),
      writer_(t.dtype, t.layout, t.normalize, t.mean, t.std),
      augmentation_(transform::Augmentation::Create(t)),
      sample_bytes_(static_cast<std::size_t>(t.width) * static_cast<std::size_t>(t.height) * 3 *
                    transform::DTypeSize(t.dtype)) {}

Status CpuFinisher::Prepare(std::uint32_t, std::uint32_t batch_size) {
  if (!augmentation_.ok()) return augmentation_.status();
  batch_size_ = batch_size;
  return Status::Ok();
}

Status CpuFinisher::Finish(std::span<const std::byte> encoded, const SampleContext& c, std::byte* buffer,
                           ImageScratch& scratch, LoaderCounters& counters) {
  return DecodeAndTransform(encoded, transform_, writer_, *augmentation_, c.seed, c.epoch, c.sample,
                            buffer + c.index * sample_bytes_, scratch, nullptr, &counters.decode_ns,
                            &counters.transform_ns);
}

std::optional<codec::Roi> CpuFinisher::PlannedRegion(int width, int height, const SampleContext& c) const {
  if (!augmentation_.ok()) return std::nullopt;
  return PlannedJpegRegion(width, height, transform_, *augmentation_, c.seed, c.epoch, c.sample);
}

}  // namespace stoker::pipeline
