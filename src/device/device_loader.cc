#include "stoker/device_loader.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>

#include <fmt/format.h>

#include "core/mutex.h"
#include "device/batch_stager.h"
#include "device/device_finisher.h"
#include "device/device_loader_internal.h"
#include "device/gpu_decode_stage.h"
#include "device/runtime.h"
#include "device/transfer_engine.h"
#include "pipeline/cpu_finisher.h"
#include "pipeline/loader_internal.h"

namespace stoker {
namespace {

device::DeviceBatch Handle(const DeviceBatchView& view) {
  device::DeviceBatch handle;
  handle.slot = view.slot;
  handle.sequence = view.sequence;
  return handle;
}

}  // namespace

struct DeviceLoader::Impl {
  std::unique_ptr<Loader> loader;
  device::DeviceRuntime* runtime = nullptr;
  int device_index = 0;
  pid_t owner = 0;  // the process that made the loader (a forked child has no staging thread)
  // Set once at creation; thread-safe itself (one thread submits while the
  // consumer waits on and releases batches).
  std::unique_ptr<device::TransferEngine> engine;
  // Held by whoever submits (Next, or the staging thread) for the whole
  // submission, and by stats().
  mutable Mutex mu;
  // Host batches whose copies were submitted: each is released back to the
  // host loader once its copy has finished (checked a batch later, when it
  // long has).
  std::deque<std::pair<Batch, device::DeviceBatch>> copying GUARDED_BY(mu);
  DeviceLoaderStats stats GUARDED_BY(mu);
  std::atomic<std::uint64_t> delivered{0};  // batches handed to the consumer
  // Set when the GPU finishes: the loader's batches are decoded crops for the kernel.
  std::shared_ptr<device::DeviceFinisher> finisher;
  device::OutputDesc output;
  // decode_on_device with a decoder: the GPU decodes the batch's JPEGs.
  std::unique_ptr<device::GpuDecodeStage> gpu_decode GUARDED_BY(mu);
  std::string device_decoder;              // the decoder's name, or "CPU: " and why
  std::shared_ptr<const Dataset> dataset;  // to name a sample in an error
  Mutex control_mu;                        // one State/SetEpoch/Restore/Reshard at a time
  // stage_ahead with GPU decode: submits ahead on a thread of its own.
  // Declared last: destroyed (its thread stopped) before what it uses.
  std::unique_ptr<device::BatchStager> stager;

  // Fetches the next host batch (waiting at most `timeout`) and submits it:
  // its view, not yet waited on by any consumer stream.
  Result<std::optional<DeviceBatchView>> FetchAndSubmit(std::chrono::nanoseconds timeout);
  Result<DeviceBatchView> SubmitLocked(Batch host) REQUIRES(mu);

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
  if (!loader_options.fields.empty())
    return Status::Unimplemented(
        "typed fields (LoaderOptions::fields) are not carried to the GPU yet: use a Loader and copy the tensors");
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
    options.staging_bytes = impl->finisher->staging_bytes();
  }
  impl->runtime = &runtime;
  impl->device_index = device_index;
  impl->owner = getpid();
  STOKER_ASSIGN_OR_RETURN(impl->engine, TransferEngine::Create(runtime, options));
  bool stage = false;
  {
    MutexLock lock(impl->mu);
    stage = device_options.stage_ahead && impl->gpu_decode != nullptr;
  }
  if (stage) {
    DeviceLoader::Impl* m = impl.get();
    BatchStager::Hooks hooks;
    hooks.start = [m] { return m->runtime->SetDevice(m->device_index); };
    hooks.produce = [m](std::chrono::nanoseconds slice) { return m->FetchAndSubmit(slice); };
    hooks.abandon = [m](const DeviceBatchView& view) { (void)m->engine->Abandon(Handle(view)); };
    impl->stager = std::make_unique<BatchStager>(std::move(hooks), options.buffers);
  }
  return std::unique_ptr<DeviceLoader>(new DeviceLoader(std::move(impl)));
}

DeviceLoader::DeviceLoader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DeviceLoader::~DeviceLoader() {
  impl_->stager.reset();  // stops staging first: it uses everything below
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

Result<std::optional<DeviceBatchView>> DeviceLoader::Impl::FetchAndSubmit(std::chrono::nanoseconds timeout) {
  STOKER_ASSIGN_OR_RETURN(std::optional<Batch> host, loader->Next(timeout));
  if (!host) return std::optional<DeviceBatchView>();
  const auto start = std::chrono::steady_clock::now();
  MutexLock lock(mu);
  STOKER_ASSIGN_OR_RETURN(DeviceBatchView view, SubmitLocked(std::move(*host)));
  stats.submit_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::optional<DeviceBatchView>(std::move(view));
}

Result<DeviceBatchView> DeviceLoader::Impl::SubmitLocked(Batch host) {
  // Host batches of earlier copies go back to the loader (their copies are done by now).
  STOKER_RETURN_IF_ERROR(RecycleCopied(0));
  const auto* bytes = static_cast<const std::byte*>(host.images());
  device::PreprocessJob job;
  if (finisher) {
    job.count = static_cast<std::int32_t>(host.size());
    job.output = output;
    job.pixels_offset = finisher->pixels_offset();
    if (finisher->augments()) job.augment_offset = static_cast<std::int64_t>(finisher->augment_table_offset());
    if (gpu_decode) {
      const std::span<const std::byte> host_batch{bytes, host.image_bytes()};
      device::GpuDecodeStage* stage = gpu_decode.get();
      const std::uint64_t* indices = host.indices();
      const Dataset* data = dataset.get();
      auto describe = [indices, data](std::int32_t k) {
        const std::uint64_t index = indices[k];
        auto info = data->Sample(index);
        if (!info.ok()) return fmt::format("sample {} of the dataset", index);
        const ShardInfo& shard = data->shards()[info->shard];
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
                          engine->Submit({bytes, host.image_bytes()}, finisher ? &job : nullptr));
  DeviceBatchView view;
  view.images = on_device.data;
  view.shape = host.shape();
  view.dtype = host.dtype();
  view.labels.assign(host.labels(), host.labels() + host.size());
  view.indices.assign(host.indices(), host.indices() + host.size());
  if (gpu_decode)  // corrupt images replaced (on_corrupt = kSkip): the batch says what it holds
    for (const device::DecodeReplacement& r : gpu_decode->replacements()) {
      view.labels[static_cast<std::size_t>(r.sample)] = view.labels[static_cast<std::size_t>(r.by)];
      view.indices[static_cast<std::size_t>(r.sample)] = view.indices[static_cast<std::size_t>(r.by)];
    }
  view.epoch = host.epoch();
  view.batch_index = host.batch_index();
  view.device_index = device_index;
  view.slot = on_device.slot;
  view.sequence = on_device.sequence;
  stats.copied_bytes += on_device.bytes;
  copying.emplace_back(std::move(host), on_device);
  return view;
}

Result<std::optional<DeviceBatchView>> DeviceLoader::Next(void* consumer_stream, std::chrono::nanoseconds timeout) {
  Impl& m = *impl_;
  if (getpid() != m.owner)
    return Status::FailedPrecondition(
        "this DeviceLoader was made in the parent process; a forked child must make its own");
  Result<std::optional<DeviceBatchView>> next = m.stager ? m.stager->Take(timeout) : m.FetchAndSubmit(timeout);
  if (!next.ok() || !next->has_value()) return next;
  // The consumer's stream waits for the batch on the GPU; the host does not.
  if (Status s = m.engine->WaitOn(Handle(**next), consumer_stream); !s.ok()) {
    (void)Release(**next, consumer_stream);
    return s;
  }
  m.delivered.fetch_add(1, std::memory_order_relaxed);
  return next;
}

Status DeviceLoader::Release(const DeviceBatchView& batch, void* consumer_stream) {
  STOKER_RETURN_IF_ERROR(impl_->engine->Release(Handle(batch), consumer_stream));
  if (impl_->stager) impl_->stager->Released();
  return Status::Ok();
}

LoaderState DeviceLoader::State() const {
  Impl& m = *impl_;
  MutexLock control(m.control_mu);
  if (!m.stager) return m.loader->state();
  LoaderState state;
  m.stager->WhilePaused(/*drop=*/false, [&](const device::BatchStager::Pending& pending) {
    state = m.loader->state();
    if (pending.end) {
      // The host loader has moved on to the next epoch; the consumer has not.
      state.epoch -= 1;
      state.batches_consumed = m.loader->batches_per_epoch();
    }
    state.batches_consumed -= std::min(state.batches_consumed, pending.consumed);
  });
  return state;
}

std::uint64_t DeviceLoader::epoch() const {
  Impl& m = *impl_;
  if (!m.stager) return m.loader->epoch();
  return State().epoch;
}

void DeviceLoader::SetEpoch(std::uint64_t epoch) {
  Impl& m = *impl_;
  MutexLock control(m.control_mu);
  if (!m.stager) return m.loader->SetEpoch(epoch);
  m.stager->WhilePaused(/*drop=*/true, [&](const device::BatchStager::Pending&) { m.loader->SetEpoch(epoch); });
}

Status DeviceLoader::Restore(const LoaderState& state) {
  Impl& m = *impl_;
  MutexLock control(m.control_mu);
  if (!m.stager) return m.loader->Restore(state);
  Status status;
  m.stager->WhilePaused(/*drop=*/true, [&](const device::BatchStager::Pending&) { status = m.loader->Restore(state); });
  return status;
}

Status DeviceLoader::Reshard(std::uint32_t rank, std::uint32_t world_size) {
  Impl& m = *impl_;
  if (!m.stager) {
    MutexLock control(m.control_mu);
    return m.loader->Reshard(rank, world_size);
  }
  // Back to where the consumer is (the staged batches are dropped), then reshard from there.
  const LoaderState here = State();
  MutexLock control(m.control_mu);
  Status status;
  m.stager->WhilePaused(/*drop=*/true, [&](const device::BatchStager::Pending& dropped) {
    if (dropped.consumed > 0 || dropped.end) status = m.loader->Restore(here);
    if (status.ok()) status = m.loader->Reshard(rank, world_size);
  });
  return status;
}

DeviceLoaderStats DeviceLoader::stats() const {
  MutexLock lock(impl_->mu);
  DeviceLoaderStats s = impl_->stats;
  s.batches = impl_->delivered.load(std::memory_order_relaxed);
  s.device_fallbacks = impl_->finisher ? impl_->finisher->fallbacks() : 0;
  s.device_cpu_warps = impl_->finisher ? impl_->finisher->cpu_warps() : 0;
  s.device_cpu_steps = impl_->finisher ? impl_->finisher->cpu_steps() : 0;
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
