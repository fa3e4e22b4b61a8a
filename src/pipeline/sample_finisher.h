// SampleFinisher: what happens to one sample after its bytes are read, and
// how a batch buffer is laid out. The loader schedules, reads and hands out
// batches; a finisher decides what a batch buffer holds:
//
// - CpuFinisher (pipeline/cpu_finisher.h): finished images, decoded,
//   cropped, resized, flipped, normalised and converted on the CPU.
// - DeviceFinisher (device/device_finisher.h): decoded crops plus per-image
//   descriptors for the GPU's preprocessing kernel; nothing below the device
//   layer knows that layout.
//
// Finish() runs on the loader's worker threads, several samples of one
// batch at once; implementations keep per-slot state thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "pipeline/image_pipeline.h"
#include "pipeline/loader_counters.h"
#include "stoker/status.h"

namespace stoker::pipeline {

// Which sample this is, for its random stream (crop, flip), and where it goes.
struct SampleContext {
  std::uint64_t seed = 0;
  std::uint64_t epoch = 0;
  std::uint64_t sample = 0;  // position in the dataset
  std::uint32_t slot = 0;    // the batch buffer
  std::uint32_t index = 0;   // the sample's place in the batch
};

class SampleFinisher {
 public:
  virtual ~SampleFinisher() = default;
  // Called once by the loader before any batch: how many batch buffers
  // (slots) it has and how many samples a batch holds at most.
  [[nodiscard]] virtual Status Prepare(std::uint32_t slots, std::uint32_t batch_size) = 0;
  // Bytes of one batch buffer.
  [[nodiscard]] virtual std::size_t BatchBufferBytes() const = 0;
  // A new batch starts in `slot`.
  virtual void BeginBatch(std::uint32_t slot) = 0;
  // Decodes `encoded` and writes the sample's part of `buffer` (the slot's
  // batch buffer). Decode errors are Corruption. Adds its time to `counters`.
  [[nodiscard]] virtual Status Finish(std::span<const std::byte> encoded, const SampleContext& context,
                                      std::byte* buffer, ImageScratch& scratch, LoaderCounters& counters) = 0;
  // The region of a width x height JPEG that Finish decodes for the sample
  // `context` names, known before its bytes are read (so that a seekable
  // JPEG's other rows need not be read); nullopt when it decodes more, or
  // cannot say.
  [[nodiscard]] virtual std::optional<codec::Roi> PlannedRegion(int /*width*/, int /*height*/,
                                                                const SampleContext& /*context*/) const {
    return std::nullopt;
  }
  // Bytes of the slot's buffer a batch of `size` samples uses.
  [[nodiscard]] virtual std::size_t UsedBytes(std::uint32_t slot, std::uint32_t size) const = 0;
};

}  // namespace stoker::pipeline
