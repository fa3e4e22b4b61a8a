// The GPU decode stage: between a batch's copy and the preprocessing
// kernel, it hands the batch's compressed JPEGs (the CompressedImage table
// the DeviceFinisher wrote) to the device's JPEG decoder, which writes each
// whole image into the slot's decode area on the copy stream. When the
// decoder refuses the batch, the images are decoded one at a time; an image
// the GPU still cannot decode is decoded on the CPU and copied into its
// place, so no sample is lost, and each path is counted.
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
};

class GpuDecodeStage {
 public:
  GpuDecodeStage(DeviceRuntime& runtime, std::unique_ptr<DeviceJpegDecoder> decoder, const DeviceFinisher& layout);

  // Decodes the GPU-routed images of the `count` samples in `host_batch` (the
  // host batch buffer, which stays valid until the copy completes) into
  // `decode_area` (device memory, layout.decode_area_bytes()) on `stream`.
  // A sample neither the GPU nor the CPU decodes is Corruption naming it
  // (`describe` turns its place in the batch into words: its key and
  // shard:offset).
  [[nodiscard]] Status Decode(std::span<const std::byte> host_batch, std::int32_t count, std::uint8_t* decode_area,
                              StreamHandle stream, const std::function<std::string(std::int32_t)>& describe);

  [[nodiscard]] const DeviceJpegDecoder& decoder() const { return *decoder_; }
  [[nodiscard]] const GpuDecodeCounts& counts() const { return counts_; }

 private:
  Status DecodeOnCpu(const DeviceJpegJob& job, StreamHandle stream);

  DeviceRuntime& runtime_;
  std::unique_ptr<DeviceJpegDecoder> decoder_;
  const DeviceFinisher& layout_;
  GpuDecodeCounts counts_;
  std::vector<DeviceJpegJob> jobs_;
  std::vector<std::int32_t> job_sample_;
};

}  // namespace stoker::device
