#include "device/gpu_decode_stage.h"

#include <cstring>

#include <fmt/format.h>

#include "codec/jpeg.h"

namespace stoker::device {

GpuDecodeStage::GpuDecodeStage(DeviceRuntime& runtime, std::unique_ptr<DeviceJpegDecoder> decoder,
                               const DeviceFinisher& layout, bool skip_corrupt)
    : runtime_(runtime), decoder_(std::move(decoder)), layout_(layout), skip_corrupt_(skip_corrupt) {}

Status GpuDecodeStage::Decode(std::span<const std::byte> host_batch, std::int32_t count, std::uint8_t* decode_area,
                              std::byte* device_batch, StreamHandle stream,
                              const std::function<std::string(std::int32_t)>& describe) {
  replacements_.clear();
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
  std::vector<std::int32_t> corrupt;
  Status first_corrupt;
  for (std::size_t j = 0; j < jobs_.size(); ++j) {
    if (decoder_->DecodeOne(jobs_[j], stream).ok()) {
      ++counts_.images;
      continue;
    }
    Status s = DecodeOnCpu(jobs_[j], stream);
    if (s.ok()) {
      ++counts_.cpu_after_error;
      continue;
    }
    s = s.WithContext(describe(job_sample_[j]));
    if (!skip_corrupt_ || s.code() != StatusCode::kCorruption) return s;
    if (corrupt.empty()) first_corrupt = s;
    corrupt.push_back(job_sample_[j]);
  }
  if (corrupt.empty()) return Status::Ok();
  if (static_cast<std::int32_t>(corrupt.size()) == count)
    return first_corrupt.WithContext("every image of its batch is corrupt: none can replace it");
  return ReplaceCorrupt(descs, count, corrupt, device_batch, stream);
}

Status GpuDecodeStage::ReplaceCorrupt(const ImageDesc* descs, std::int32_t count, std::span<const std::int32_t> corrupt,
                                      std::byte* device_batch, StreamHandle stream) {
  std::vector<bool> bad(static_cast<std::size_t>(count), false);
  for (std::int32_t k : corrupt) bad[static_cast<std::size_t>(k)] = true;
  std::vector<ImageDesc> patched;
  patched.reserve(corrupt.size());
  for (std::int32_t k : corrupt) {
    std::int32_t by = -1;
    for (std::int32_t m = k + 1; m < count && by < 0; ++m)
      if (!bad[static_cast<std::size_t>(m)]) by = m;
    for (std::int32_t m = k - 1; m >= 0 && by < 0; --m)
      if (!bad[static_cast<std::size_t>(m)]) by = m;
    // The kernel then finishes image `by` (its pixels, crop and flip) into place k.
    patched.push_back(descs[by]);
    STOKER_RETURN_IF_ERROR(runtime_.CopyToDeviceAsync(device_batch + static_cast<std::size_t>(k) * sizeof(ImageDesc),
                                                      &patched.back(), sizeof(ImageDesc), stream));
    if (layout_.augments()) {  // and with its augmentation (the host batch holds it until the copy completes)
      const std::size_t table = layout_.augment_table_offset();
      const auto* host = reinterpret_cast<const std::byte*>(descs);
      STOKER_RETURN_IF_ERROR(runtime_.CopyToDeviceAsync(
          device_batch + table + static_cast<std::size_t>(k) * sizeof(AugmentDesc),
          host + table + static_cast<std::size_t>(by) * sizeof(AugmentDesc), sizeof(AugmentDesc), stream));
    }
    replacements_.push_back({k, by});
    ++counts_.corrupt_skipped;
  }
  // The copies read `patched` after this returns: wait for them (a rare path).
  return runtime_.SynchronizeStream(stream);
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
