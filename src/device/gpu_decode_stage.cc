#include "device/gpu_decode_stage.h"

#include <cstring>

#include <fmt/format.h>

#include "codec/jpeg.h"

namespace stoker::device {

GpuDecodeStage::GpuDecodeStage(DeviceRuntime& runtime, std::unique_ptr<DeviceJpegDecoder> decoder,
                               const DeviceFinisher& layout)
    : runtime_(runtime), decoder_(std::move(decoder)), layout_(layout) {}

Status GpuDecodeStage::Decode(std::span<const std::byte> host_batch, std::int32_t count, std::uint8_t* decode_area,
                              StreamHandle stream, const std::function<std::string(std::int32_t)>& describe) {
  const auto* descs = reinterpret_cast<const ImageDesc*>(host_batch.data());
  const auto* table = reinterpret_cast<const CompressedImage*>(host_batch.data() + layout_.compressed_table_offset());
  const std::byte* pixels = host_batch.data() + layout_.pixels_offset();
  jobs_.clear();
  job_sample_.clear();
  for (std::int32_t k = 0; k < count; ++k) {
    const CompressedImage& ref = table[k];
    if (ref.length == 0) continue;  // decoded on the CPU
    const ImageDesc& desc = descs[k];
    if (desc.source != 1 || layout_.pixels_offset() + ref.offset + ref.length > host_batch.size() ||
        desc.offset + static_cast<std::uint64_t>(ref.width) * ref.height * 3 > layout_.decode_area_bytes())
      return Status::Internal(fmt::format("GPU decode: batch record {} is inconsistent", k));
    DeviceJpegJob job;
    job.jpeg = {pixels + ref.offset, static_cast<std::size_t>(ref.length)};
    job.out = decode_area + desc.offset;
    job.width = ref.width;
    job.height = ref.height;
    job.hardware = ref.hardware != 0;
    jobs_.push_back(job);
    job_sample_.push_back(k);
  }
  if (jobs_.empty()) return Status::Ok();
  if (decoder_->DecodeBatch(jobs_, stream).ok()) {
    counts_.images += jobs_.size();
    return Status::Ok();
  }
  // The decoder refused the batch (one image it could not take, as a rule):
  // each image alone, then the CPU for what the GPU still refuses.
  ++counts_.batch_failures;
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    if (decoder_->DecodeOne(jobs_[j], stream).ok()) {
      ++counts_.images;
      continue;
    }
    Status s = DecodeOnCpu(jobs_[j], stream);
    if (!s.ok()) return s.WithContext(describe(job_sample_[j]));
    ++counts_.cpu_after_error;
  }
  return Status::Ok();
}

Status GpuDecodeStage::DecodeOnCpu(const DeviceJpegJob& job, StreamHandle stream) {
  codec::DecodedRegion decoded;
  STOKER_RETURN_IF_ERROR(codec::DecodeJpeg(job.jpeg, codec::Roi{}, 1, decoded));
  if (decoded.width != job.width || decoded.height != job.height)
    return Status::Corruption(fmt::format("the JPEG decodes to {}x{}, but its header says {}x{}", decoded.width,
                                          decoded.height, job.width, job.height));
  // The copy reads host memory after this returns: wait for it (a rare path).
  STOKER_RETURN_IF_ERROR(runtime_.CopyToDeviceAsync(job.out, decoded.pixels.data(), decoded.pixels.size(), stream));
  return runtime_.SynchronizeStream(stream);
}

}  // namespace stoker::device
