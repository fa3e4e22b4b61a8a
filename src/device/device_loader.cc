#include "stoker/device_loader.h"

#include <chrono>
#include <deque>

#include <fmt/format.h>

#include "core/mutex.h"
#include "device/device_finisher.h"
#include "device/device_loader_internal.h"
#include "device/gpu_decode_stage.h"
#include "device/runtime.h"
#include "device/transfer_engine.h"
#include "pipeline/cpu_finisher.h"
#include "pipeline/loader_internal.h"

namespace stoker {

struct DeviceLoader::Impl {
  std::unique_ptr<Loader> loader;
  device::DeviceRuntime* runtime = nullptr;
  int device_index = 0;
  mutable Mutex mu;  // the engine is not thread-safe; Release may come from any thread
  std::unique_ptr<device::TransferEngine> engine GUARDED_BY(mu);
  // Host batches whose copies were submitted: each is released back to the
  // host loader once its copy has finished (checked a batch later, when it
  // long has).
  std::deque<std::pair<Batch, device::DeviceBatch>> copying GUARDED_BY(mu);
  DeviceLoaderStats stats GUARDED_BY(mu);
  // Set when the GPU finishes: the loader's batches are decoded crops for the kernel.
  std::shared_ptr<device::DeviceFinisher> finisher;
  device::OutputDesc output;
  // decode_on_device with a decoder: the GPU decodes the batch's JPEGs.
  std::unique_ptr<device::GpuDecodeStage> gpu_decode GUARDED_BY(mu);
  std::string device_decoder;              // the decoder's name, or "CPU: " and why
  std::shared_ptr<const Dataset> dataset;  // to name a sample in an error

  Status RecycleCopied(std::size_t keep) REQUIRES(mu) {
    while (copying.size() > keep) {
      auto& [host, on_device] = copying.front();
      STOKER_RETURN_IF_ERROR(engine->WaitCopied(on_device));
      auto ms = engine->CopyMilliseconds(on_device);
      if (ms.ok()) stats.copy_seconds += *ms / 1000.0;
      copying.pop_front();  // the host batch goes back to the loader's pool
    }
    return Status::Ok();
  }
};

Result<std::unique_ptr<DeviceLoader>> DeviceLoader::Create(std::shared_ptr<const Dataset> dataset,
                                                           const LoaderOptions& options, Device device,
                                                           const DeviceLoaderOptions& device_options) {
  if (device.kind != DeviceKind::kCuda)
    return Status::InvalidArgument(fmt::format("DeviceLoader needs a CUDA device, not {}", device.ToString()));
  std::string why;
  device::DeviceRuntime* runtime = device::CudaDeviceRuntime(&why);
  if (runtime == nullptr) return Status::Unavailable(fmt::format("cannot use {}: {}", device.ToString(), why));
  if (device.index >= runtime->device_count())
    return Status::InvalidArgument(
        fmt::format("{} requested but only {} CUDA device(s) present", device.ToString(), runtime->device_count()));
  return device::CreateDeviceLoader(std::move(dataset), options, *runtime, device.index, device_options);
}

Result<std::unique_ptr<DeviceLoader>> device::CreateDeviceLoader(std::shared_ptr<const Dataset> dataset,
                                                                 const LoaderOptions& loader_options,
                                                                 DeviceRuntime& runtime, int device_index,
                                                                 const DeviceLoaderOptions& device_options) {
  return CreateDeviceLoader(std::move(dataset), loader_options, runtime, device_index, device_options,
                            &OpenNvjpegDecoder);
}

Result<std::unique_ptr<DeviceLoader>> device::CreateDeviceLoader(std::shared_ptr<const Dataset> dataset,
                                                                 const LoaderOptions& loader_options,
                                                                 DeviceRuntime& runtime, int device_index,
                                                                 const DeviceLoaderOptions& device_options,
                                                                 const OpenJpegDecoder& open_decoder) {
  if (device_options.decode_on_device && !device_options.finish_on_device)
    return Status::InvalidArgument("decode_on_device needs finish_on_device (the GPU finishes what it decodes)");
  if (device_options.decode_on_device && (device_options.device_decode_bytes_per_sample < (64u << 10) ||
                                          device_options.device_decode_bytes_per_sample > (std::size_t{1} << 30)))
    return Status::InvalidArgument(fmt::format("device_decode_bytes_per_sample {} must be between 64 KiB and 1 GiB",
                                               device_options.device_decode_bytes_per_sample));
  if (device_options.device_buffers > 64)
    return Status::InvalidArgument(
        fmt::format("device_buffers {} is more than the limit 64", device_options.device_buffers));
  STOKER_RETURN_IF_ERROR(runtime.SetDevice(device_index));
  auto impl = std::make_unique<DeviceLoader::Impl>();
  std::shared_ptr<pipeline::SampleFinisher> finisher;
  if (device_options.finish_on_device) {
    impl->finisher = std::make_shared<DeviceFinisher>(loader_options.transform, device_options.device_input_factor);
    finisher = impl->finisher;
    if (device_options.decode_on_device) {
      std::string why;
      std::unique_ptr<DeviceJpegDecoder> decoder = open_decoder(&why);
      if (decoder != nullptr) {
        impl->finisher->EnableDeviceDecode(decoder->caps(), device_options.device_decode_bytes_per_sample);
        impl->device_decoder = decoder->name();
        MutexLock lock(impl->mu);
        impl->gpu_decode = std::make_unique<GpuDecodeStage>(runtime, std::move(decoder), *impl->finisher,
                                                            loader_options.on_corrupt == CorruptPolicy::kSkip);
      } else {
        impl->device_decoder = "CPU: " + why;
      }
    }
  } else {
    finisher = std::make_shared<pipeline::CpuFinisher>(loader_options.transform);
  }
  impl->dataset = dataset;
  STOKER_ASSIGN_OR_RETURN(impl->loader, pipeline::CreateLoader(std::move(dataset), loader_options, finisher));
  TransferOptions options;
  options.input_bytes = impl->loader->batch_buffer_bytes();
  options.buffers = std::max<std::uint32_t>(device_options.device_buffers, 2);
  options.timing = true;
  if (impl->finisher) {
    // The GPU finishes: the kernel writes the output images.
    impl->output = impl->finisher->output();
    options.output_bytes = static_cast<std::size_t>(impl->loader->batch_capacity()) * OutputImageBytes(impl->output);
    options.decode_bytes = impl->finisher->decode_area_bytes();
  }
  impl->runtime = &runtime;
  impl->device_index = device_index;
  STOKER_ASSIGN_OR_RETURN(auto engine, TransferEngine::Create(runtime, options));
  {
    MutexLock lock(impl->mu);
    impl->engine = std::move(engine);
  }
  return std::unique_ptr<DeviceLoader>(new DeviceLoader(std::move(impl)));
}

DeviceLoader::DeviceLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceLoader::~DeviceLoader() {
  MutexLock lock(impl_->mu);
  (void)impl_->RecycleCopied(0);
  impl_->engine.reset();  // waits for the GPU's use of the pool
}

Loader& DeviceLoader::loader() {
  return *impl_->loader;
}

Result<std::optional<DeviceBatchView>> DeviceLoader::Next(void* consumer_stream) {
  return Next(consumer_stream, std::chrono::nanoseconds::max());
}

Result<std::optional<DeviceBatchView>> DeviceLoader::Next(void* consumer_stream, std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  STOKER_ASSIGN_OR_RETURN(std::optional<Batch> host, m.loader->Next(timeout));
  if (!host) return std::optional<DeviceBatchView>();
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(m.mu);
  // Host batches of earlier copies go back to the loader (their copies are done by now).
  STOKER_RETURN_IF_ERROR(m.RecycleCopied(0));
  const auto* bytes = static_cast<const std::byte*>(host->images());
  device::PreprocessJob job;
  if (m.finisher) {
    job.count = static_cast<std::int32_t>(host->size());
    job.output = m.output;
    job.pixels_offset = m.finisher->pixels_offset();
    if (m.gpu_decode) {
      const std::span<const std::byte> host_batch{bytes, host->image_bytes()};
      device::GpuDecodeStage* stage = m.gpu_decode.get();
      const std::uint64_t* indices = host->indices();
      const Dataset* dataset = m.dataset.get();
      auto describe = [indices, dataset](std::int32_t k) {
        const std::uint64_t index = indices[k];
        auto info = dataset->Sample(index);
        if (!info.ok()) return fmt::format("sample {} of the dataset", index);
        const ShardInfo& shard = dataset->shards()[info->shard];
        std::uint64_t offset = 0;
        for (const auto& field : info->fields)
          if (field) offset = offset == 0 ? field->offset : std::min(offset, field->offset);
        return fmt::format("sample '{}' (dataset position {}) at {}:{}", info->key, index, shard.path, offset);
      };
      job.decode = [stage, host_batch, count = job.count, describe](std::uint8_t* area, std::byte* device_batch,
                                                                    device::StreamHandle stream) {
        return stage->Decode(host_batch, count, area, device_batch, stream, describe);
      };
    }
  }
  STOKER_ASSIGN_OR_RETURN(device::DeviceBatch on_device,
                          m.engine->Submit({bytes, host->image_bytes()}, m.finisher ? &job : nullptr));
  STOKER_RETURN_IF_ERROR(m.engine->WaitOn(on_device, consumer_stream));
  DeviceBatchView view;
  view.images = on_device.data;
  view.shape = host->shape();
  view.dtype = host->dtype();
  view.labels.assign(host->labels(), host->labels() + host->size());
  view.indices.assign(host->indices(), host->indices() + host->size());
  if (m.gpu_decode)  // corrupt images replaced (on_corrupt = kSkip): the batch says what it holds
    for (const device::DecodeReplacement& r : m.gpu_decode->replacements()) {
      view.labels[static_cast<std::size_t>(r.sample)] = view.labels[static_cast<std::size_t>(r.by)];
      view.indices[static_cast<std::size_t>(r.sample)] = view.indices[static_cast<std::size_t>(r.by)];
    }
  view.epoch = host->epoch();
  view.batch_index = host->batch_index();
  view.device_index = m.device_index;
  view.slot = on_device.slot;
  view.sequence = on_device.sequence;
  ++m.stats.batches;
  m.stats.copied_bytes += on_device.bytes;
  m.copying.emplace_back(std::move(*host), on_device);
  m.stats.submit_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::optional<DeviceBatchView>(std::move(view));
}

Status DeviceLoader::Release(const DeviceBatchView& batch, void* consumer_stream) {
  MutexLock lock(impl_->mu);
  device::DeviceBatch handle;
  handle.slot = batch.slot;
  handle.sequence = batch.sequence;
  return impl_->engine->Release(handle, consumer_stream);
}

DeviceLoaderStats DeviceLoader::stats() const {
  MutexLock lock(impl_->mu);
  DeviceLoaderStats s = impl_->stats;
  s.device_fallbacks = impl_->finisher ? impl_->finisher->fallbacks() : 0;
  s.device_decoder = impl_->device_decoder;
  if (impl_->finisher && impl_->finisher->decodes_on_device()) {
    const device::DeviceDecodeRouting r = impl_->finisher->routing();
    s.decoded_on_hardware = r.on_hardware;
    s.decode_no_room = r.no_room;
    s.decoded_on_cpu_by_reason.assign(r.cpu_reasons.begin(), r.cpu_reasons.end());
  }
  if (impl_->gpu_decode) {
    const device::GpuDecodeCounts& c = impl_->gpu_decode->counts();
    s.decoded_on_device = c.images;
    s.decode_batch_failures = c.batch_failures;
    s.decode_cpu_after_error = c.cpu_after_error;
    s.decode_corrupt_skipped = c.corrupt_skipped;
  }
  return s;
}

}  // namespace stoker
