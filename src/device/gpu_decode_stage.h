// The GPU decode stage: between a batch's copy and the preprocessing
// kernel, it hands the batch's compressed JPEGs (the CompressedImage table
// the DeviceFinisher wrote) to the device's JPEG decoder, which writes each
// whole image into the slot's decode area on the copy stream. When the
// decoder refuses the batch, the images are decoded one at a time; an image
// the GPU still cannot decode is decoded on the CPU and copied into its
// place, so no sample is lost, and each path is counted. An image neither
// decodes (a good header over corrupt data) is an error naming it, or, with
// on_corrupt = kSkip, is replaced by the next good image of its batch, as
// the CPU path replaces a corrupt sample by the next one in the epoch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "device/device_finisher.h"
#include "device/jpeg_decoder.h"
#include "device/runtime.h"

namespace stoker::device {

struct GpuDecodeCounts {
  std::uint64_t images = 0;           // decoded by the GPU's decoders
  std::uint64_t batch_failures = 0;   // batches the decoder refused, then decoded one by one
  std::uint64_t cpu_after_error = 0;  // images the GPU could not decode alone either: decoded on the CPU
  std::uint64_t corrupt_skipped = 0;  // images neither decoded, replaced (kSkip)
};

// A corrupt image replaced by another of its batch: batch positions.
struct DecodeReplacement {
  std::int32_t sample = 0;
  std::int32_t by = 0;
};

class GpuDecodeStage {
 public:
  // `skip_corrupt`: replace an image neither the GPU nor the CPU decodes
  // (on_corrupt = kSkip) instead of failing the batch.
  GpuDecodeStage(DeviceRuntime& runtime, std::unique_ptr<DeviceJpegDecoder> decoder, const DeviceFinisher& layout,
                 bool skip_corrupt);

  // Decodes the GPU-routed images of the `count` samples in `host_batch` (the
  // host batch buffer, which stays valid until the copy completes) into
  // `decode_area` (device memory, layout.decode_area_bytes()) on `stream`;
  // `device_batch` is the batch's copy on the device. A sample neither the
  // GPU nor the CPU decodes is Corruption naming it (`describe` turns its
  // place in the batch into words: its key and shard:offset); with
  // skip_corrupt, its ImageDesc on the device becomes that of the next good
  // image of the batch (the previous, for the last), listed in
  // replacements(), and only a batch with no good image fails.
  [[nodiscard]] Status Decode(std::span<const std::byte> host_batch, std::int32_t count, std::uint8_t* decode_area,
                              std::byte* device_batch, StreamHandle stream,
                              const std::function<std::string(std::int32_t)>& describe);
  // The last Decode's replacements (empty as a rule).
  [[nodiscard]] const std::vector<DecodeReplacement>& replacements() const { return replacements_; }

  [[nodiscard]] const DeviceJpegDecoder& decoder() const { return *decoder_; }
  [[nodiscard]] const GpuDecodeCounts& counts() const { return counts_; }

 private:
  Status DecodeOnCpu(const DeviceJpegJob& job, StreamHandle stream);
  Status ReplaceCorrupt(const ImageDesc* descs, std::int32_t count, std::span<const std::int32_t> corrupt,
                        std::byte* device_batch, StreamHandle stream);

  DeviceRuntime& runtime_;
  std::unique_ptr<DeviceJpegDecoder> decoder_;
  const DeviceFinisher& layout_;
  const bool skip_corrupt_;
  GpuDecodeCounts counts_;
  std::vector<DecodeReplacement> replacements_;
  std::vector<DeviceJpegJob> jobs_;
  std::vector<std::int32_t> job_sample_;
};

}  // namespace stoker::device
