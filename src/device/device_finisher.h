// DeviceFinisher: batch buffers laid out for the GPU's preprocessing kernel.
// Each buffer is [ImageDesc x batch][pixels]: workers decode each sample's
// crop (region of interest, DCT scaling) and copy only the box's whole
// pixels into the pixel area at an atomic cursor; the descriptor says where
// they are, the box and the flip. When a batch's room (device_input_factor
// output-sized images per sample) runs out, the crop is resized on the CPU
// into the sample's reserved output-sized slot and the GPU only flips,
// normalises and converts it (counted as a fallback).
#pragma once

#include <atomic>
#include <memory>

#include "device/preprocess_math.h"
#include "pipeline/sample_finisher.h"
#include "stoker/loader.h"

namespace stoker::device {

class DeviceFinisher final : public pipeline::SampleFinisher {
 public:
  // `input_factor`: room for decoded crops, in output-sized uint8 images per
  // sample, beyond the one output-sized image always reserved for each.
  DeviceFinisher(const TransformOptions& transform, float input_factor);

  Status Prepare(std::uint32_t slots, std::uint32_t batch_size) override;
  std::size_t BatchBufferBytes() const override { return desc_bytes_ + pixel_capacity_; }
  void BeginBatch(std::uint32_t slot) override;
  Status Finish(std::span<const std::byte> encoded, const pipeline::SampleContext& context, std::byte* buffer,
                ImageScratch& scratch, pipeline::LoaderCounters& counters) override;
  std::size_t UsedBytes(std::uint32_t slot, std::uint32_t size) const override;

  // Where the pixels start in a batch buffer (after the descriptor table).
  [[nodiscard]] std::size_t pixels_offset() const { return desc_bytes_; }
  // The kernel's output description for the transform.
  [[nodiscard]] OutputDesc output() const;
  // Crops resized on the CPU because their batch ran out of room.
  [[nodiscard]] std::uint64_t fallbacks() const { return fallbacks_.load(std::memory_order_relaxed); }

 private:
  TransformOptions transform_;
  float input_factor_;
  std::size_t image_bytes_ = 0;  // one output-sized uint8 RGB image
  std::size_t desc_bytes_ = 0, fallback_bytes_ = 0, pixel_capacity_ = 0;
  std::unique_ptr<std::atomic<std::uint64_t>[]> pixel_used_;  // per slot, from the start of the pixel area
  std::atomic<std::uint64_t> fallbacks_{0};
};

}  // namespace stoker::device
