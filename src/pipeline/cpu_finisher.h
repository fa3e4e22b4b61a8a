// CpuFinisher: every sample finished on the CPU into its place in the
// batch: [N, C, H, W] or [N, H, W, C] elements of the output dtype.
#pragma once

#include "pipeline/sample_finisher.h"
#include "stoker/loader.h"
#include "transform/augmentation.h"
#include "transform/transform.h"

namespace stoker::pipeline {

class CpuFinisher final : public SampleFinisher {
 public:
  explicit CpuFinisher(const TransformOptions& transform);
  Status Prepare(std::uint32_t slots, std::uint32_t batch_size) override;
  std::size_t BatchBufferBytes() const override { return sample_bytes_ * batch_size_; }
  void BeginBatch(std::uint32_t) override {}
  Status Finish(std::span<const std::byte> encoded, const SampleContext& context, std::byte* buffer,
                ImageScratch& scratch, LoaderCounters& counters) override;
  std::size_t UsedBytes(std::uint32_t, std::uint32_t size) const override { return sample_bytes_ * size; }
  std::optional<codec::Roi> PlannedRegion(int width, int height, const SampleContext& context) const override;

 private:
  TransformOptions transform_;
  transform::OutputWriter writer_;
  Result<transform::Augmentation> augmentation_;
  std::size_t sample_bytes_ = 0;
  std::uint32_t batch_size_ = 0;
};

}  // namespace stoker::pipeline
