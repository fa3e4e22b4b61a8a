#include "stoker/device_loader.h"

#include <chrono>
#include <deque>

#include <fmt/format.h>

#include "core/mutex.h"
#include "device/preprocess_cpu.h"
#include "device/runtime.h"
#include "device/transfer_engine.h"

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
  bool finish = false;  // the loader's batches are decoded crops for the kernel
  device::OutputDesc output;

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

Result<std::unique_ptr<DeviceLoader>> DeviceLoader::Create(std::unique_ptr<Loader> loader, Device device,
                                                           std::uint32_t device_buffers) {
  if (device.kind != DeviceKind::kCuda)
    return Status::InvalidArgument(fmt::format("DeviceLoader needs a CUDA device, not {}", device.ToString()));
  std::string why;
  device::DeviceRuntime* runtime = device::CudaDeviceRuntime(&why);
  if (runtime == nullptr) return Status::Unavailable(fmt::format("cannot use {}: {}", device.ToString(), why));
  if (device.index >= runtime->device_count())
    return Status::InvalidArgument(
        fmt::format("{} requested but only {} CUDA device(s) present", device.ToString(), runtime->device_count()));
  return CreateWithRuntime(std::move(loader), *runtime, device.index, device_buffers);
}

Result<std::unique_ptr<DeviceLoader>> DeviceLoader::CreateWithRuntime(std::unique_ptr<Loader> loader,
                                                                      device::DeviceRuntime& runtime, int device_index,
                                                                      std::uint32_t device_buffers) {
  if (!loader) return Status::InvalidArgument("DeviceLoader needs a loader");
  STOKER_RETURN_IF_ERROR(runtime.SetDevice(device_index));
  const auto& t = loader->options().transform;
  device::TransferOptions options;
  options.input_bytes = loader->batch_buffer_bytes();
  options.buffers = std::max<std::uint32_t>(device_buffers, 2);
  options.timing = true;
  auto impl = std::make_unique<Impl>();
  if (loader->options().finish_on_device) {
    // The GPU finishes: the kernel writes the output images.
    device::OutputDesc& o = impl->output;
    o.width = t.width;
    o.height = t.height;
    o.type = static_cast<device::OutputType>(t.dtype);
    o.channels_last = t.layout == Layout::kNHWC ? 1 : 0;
    o.normalize = t.normalize ? 1 : 0;
    for (int c = 0; c < 3; ++c) {
      o.mean[c] = t.mean[c];
      o.inv_std[c] = 1.0f / t.std[c];
    }
    options.output_bytes = static_cast<std::size_t>(loader->options().batch_size) * device::OutputImageBytes(o);
    impl->finish = true;
  }
  impl->loader = std::move(loader);
  impl->runtime = &runtime;
  impl->device_index = device_index;
  STOKER_ASSIGN_OR_RETURN(auto engine, device::TransferEngine::Create(runtime, options));
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
  Impl& m = *impl_;
  STOKER_ASSIGN_OR_RETURN(std::optional<Batch> host, m.loader->Next());
  if (!host) return std::optional<DeviceBatchView>();
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(m.mu);
  // Host batches of earlier copies go back to the loader (their copies are done by now).
  STOKER_RETURN_IF_ERROR(m.RecycleCopied(0));
  const auto* bytes = static_cast<const std::byte*>(host->images());
  device::PreprocessJob job;
  if (m.finish) {
    job.count = static_cast<std::int32_t>(host->size());
    job.output = m.output;
    job.pixels_offset = host->device_pixels_offset();
  }
  STOKER_ASSIGN_OR_RETURN(device::DeviceBatch on_device,
                          m.engine->Submit({bytes, host->image_bytes()}, m.finish ? &job : nullptr));
  STOKER_RETURN_IF_ERROR(m.engine->WaitOn(on_device, consumer_stream));
  DeviceBatchView view;
  view.images = on_device.data;
  view.shape = host->shape();
  view.dtype = host->dtype();
  view.labels.assign(host->labels(), host->labels() + host->size());
  view.indices.assign(host->indices(), host->indices() + host->size());
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
  return impl_->stats;
}

}  // namespace stoker
