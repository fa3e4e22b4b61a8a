#include "device/transfer_engine.h"

#include <fmt/format.h>

namespace stoker::device {

struct TransferEngine::Slot {
  DeviceMemory input;
  DeviceMemory output;
  DeviceMemory decode;   // the GPU JPEG decoder's output area
  DeviceMemory staging;  // the augmentation kernels' uint8 images
  Event copy_start, copied, ready, released;
  bool held = false;           // by the consumer (between Submit and Release)
  bool ever_released = false;  // `released` has been recorded: the next copy must wait on it
  std::uint64_t sequence = 0;
};

Result<std::unique_ptr<TransferEngine>> TransferEngine::Create(DeviceRuntime& runtime, const TransferOptions& options) {
  if (options.buffers < 2) return Status::InvalidArgument("the transfer engine needs at least 2 device buffers");
  if (options.input_bytes == 0) return Status::InvalidArgument("input_bytes must be positive");
  std::unique_ptr<TransferEngine> engine(new TransferEngine(runtime, options));
  STOKER_ASSIGN_OR_RETURN(engine->copy_stream_, MakeStream(runtime));
  for (std::uint32_t i = 0; i < options.buffers; ++i) {
    auto slot = std::make_unique<Slot>();
    auto input = MakeDeviceMemory(runtime, options.input_bytes);
    if (!input.ok())
      return input.error().WithContext(
          fmt::format("device buffer {} of {} ({} bytes)", i, options.buffers, options.input_bytes));
    slot->input = std::move(*input);
    if (options.output_bytes > 0) {
      STOKER_ASSIGN_OR_RETURN(slot->output, MakeDeviceMemory(runtime, options.output_bytes));
    }
    if (options.decode_bytes > 0) {
      auto decode = MakeDeviceMemory(runtime, options.decode_bytes);
      if (!decode.ok())
        return decode.error().WithContext(
            fmt::format("GPU decode area {} of {} ({} bytes; lower "
                        "device_decode_bytes_per_sample)",
                        i, options.buffers, options.decode_bytes));
      slot->decode = std::move(*decode);
    }
    if (options.staging_bytes > 0) {
      auto staging = MakeDeviceMemory(runtime, options.staging_bytes);
      if (!staging.ok())
        return staging.error().WithContext(
            fmt::format("augmentation staging area {} of {} ({} bytes)", i, options.buffers, options.staging_bytes));
      slot->staging = std::move(*staging);
    }
    STOKER_ASSIGN_OR_RETURN(slot->copy_start, MakeEvent(runtime, options.timing));
    STOKER_ASSIGN_OR_RETURN(slot->copied, MakeEvent(runtime, options.timing));
    STOKER_ASSIGN_OR_RETURN(slot->ready, MakeEvent(runtime));
    STOKER_ASSIGN_OR_RETURN(slot->released, MakeEvent(runtime));
    engine->slots_.push_back(std::move(slot));
  }
  return engine;
}

TransferEngine::TransferEngine(DeviceRuntime& runtime, TransferOptions options)
    : runtime_(runtime), options_(options) {}

TransferEngine::~TransferEngine() {
  // Device memory may be freed only when nothing uses it any more.
  for (auto& slot : slots_) {
    if (slot->sequence > 0) (void)runtime_.SynchronizeEvent(slot->ready.get());
    if (slot->ever_released) (void)runtime_.SynchronizeEvent(slot->released.get());
  }
}

StreamHandle TransferEngine::copy_stream() const {
  return copy_stream_.get();
}

EventHandle TransferEngine::copied_event(const DeviceBatch& batch) const {
  return batch.slot < slots_.size() ? slots_[batch.slot]->copied.get() : nullptr;
}

std::uint32_t TransferEngine::free_slots() const {
  MutexLock lock(mu_);
  std::uint32_t n = 0;
  for (const auto& s : slots_) n += !s->held;
  return n;
}

TransferEngine::Slot* TransferEngine::InFlight(const DeviceBatch& batch) const {
  if (batch.slot >= slots_.size() || slots_[batch.slot]->sequence != batch.sequence) return nullptr;
  return slots_[batch.slot].get();
}

Result<DeviceBatch> TransferEngine::Submit(std::span<const std::byte> host, const PreprocessJob* job) {
  if (host.size() > options_.input_bytes)
    return Status::InvalidArgument(
        fmt::format("batch of {} bytes exceeds the device buffers' {} bytes", host.size(), options_.input_bytes));
  if (job != nullptr && options_.output_bytes == 0)
    return Status::InvalidArgument("preprocessing needs an engine created with output_bytes");
  std::uint32_t chosen = UINT32_MAX;
  bool wait_released = false;
  DeviceBatch batch;
  {
    MutexLock lock(mu_);
    // Round robin over free slots, so consecutive batches use different buffers.
    for (std::uint32_t k = 0; k < slots_.size(); ++k) {
      const std::uint32_t i = (next_slot_ + k) % static_cast<std::uint32_t>(slots_.size());
      if (!slots_[i]->held) {
        chosen = i;
        break;
      }
    }
    if (chosen == UINT32_MAX)
      return Status::ResourceExhausted(fmt::format(
          "all {} device buffers are held by the consumer; release batches before asking for more", slots_.size()));
    next_slot_ = (chosen + 1) % static_cast<std::uint32_t>(slots_.size());
    // Reserved: the work below is enqueued without the lock, the slot being ours alone.
    Slot& slot = *slots_[chosen];
    slot.held = true;
    slot.sequence = ++submitted_;
    wait_released = slot.ever_released;
    batch.slot = chosen;
    batch.sequence = slot.sequence;
  }
  Slot& slot = *slots_[chosen];
  auto enqueue = [&]() -> Status {
    const StreamHandle stream = copy_stream_.get();
    // The consumer's last use of this slot must finish first (on the GPU).
    if (wait_released) STOKER_RETURN_IF_ERROR(runtime_.StreamWaitEvent(stream, slot.released.get()));
    if (options_.timing) STOKER_RETURN_IF_ERROR(runtime_.RecordEvent(slot.copy_start.get(), stream));
    STOKER_RETURN_IF_ERROR(runtime_.CopyToDeviceAsync(slot.input.get(), host.data(), host.size(), stream));
    STOKER_RETURN_IF_ERROR(runtime_.RecordEvent(slot.copied.get(), stream));
    batch.data = slot.input.get();
    batch.bytes = host.size();
    if (job != nullptr) {
      const auto* base = static_cast<const std::uint8_t*>(slot.input.get());
      auto* decoded = static_cast<std::uint8_t*>(slot.decode.get());
      if (job->decode) {
        if (decoded == nullptr) return Status::InvalidArgument("GPU decode needs an engine created with decode_bytes");
        STOKER_RETURN_IF_ERROR(job->decode(decoded, static_cast<std::byte*>(slot.input.get()), stream));
      }
      if (job->augment_offset >= 0) {
        if (slot.staging.get() == nullptr)
          return Status::InvalidArgument("the augmentation kernels need an engine created with staging_bytes");
        STOKER_RETURN_IF_ERROR(runtime_.LaunchAugment(
            base + job->pixels_offset, decoded, reinterpret_cast<const ImageDesc*>(base),
            reinterpret_cast<const AugmentDesc*>(base + job->augment_offset), job->count, job->output,
            static_cast<std::uint8_t*>(slot.staging.get()), slot.output.get(), stream));
      } else {
        STOKER_RETURN_IF_ERROR(runtime_.LaunchPreprocess(base + job->pixels_offset, decoded,
                                                         reinterpret_cast<const ImageDesc*>(base), job->count,
                                                         job->output, slot.output.get(), stream));
      }
      batch.data = slot.output.get();
      batch.bytes = options_.output_bytes;
    }
    return runtime_.RecordEvent(slot.ready.get(), stream);
  };
  if (Status s = enqueue(); !s.ok()) {
    MutexLock lock(mu_);
    slot.held = false;  // back to the pool; whatever was enqueued stays ahead of its next use on the copy stream
    return s;
  }
  return batch;
}

Status TransferEngine::WaitOn(const DeviceBatch& batch, StreamHandle consumer) {
  MutexLock lock(mu_);
  Slot* slot = InFlight(batch);
  if (slot == nullptr) return Status::InvalidArgument("WaitOn: not a batch in flight");
  return runtime_.StreamWaitEvent(consumer, slot->ready.get());
}

Status TransferEngine::WaitCopied(const DeviceBatch& batch) {
  EventHandle copied = nullptr;
  {
    MutexLock lock(mu_);
    Slot* slot = InFlight(batch);
    if (slot == nullptr) return Status::InvalidArgument("WaitCopied: not a batch in flight");
    copied = slot->copied.get();
  }
  // The host waits without the lock (releases go on meanwhile); only the
  // submitting thread re-records `copied`, and it is the one waiting here.
  return runtime_.SynchronizeEvent(copied);
}

Status TransferEngine::Release(const DeviceBatch& batch, StreamHandle consumer) {
  MutexLock lock(mu_);
  Slot* slot = InFlight(batch);
  if (slot == nullptr || !slot->held) return Status::InvalidArgument("Release: not a batch the consumer holds");
  STOKER_RETURN_IF_ERROR(runtime_.RecordEvent(slot->released.get(), consumer));
  slot->ever_released = true;
  slot->held = false;
  return Status::Ok();
}

Status TransferEngine::Abandon(const DeviceBatch& batch) {
  MutexLock lock(mu_);
  Slot* slot = InFlight(batch);
  if (slot == nullptr || !slot->held) return Status::InvalidArgument("Abandon: not a batch in flight");
  slot->held = false;
  return Status::Ok();
}

Result<float> TransferEngine::CopyMilliseconds(const DeviceBatch& batch) {
  if (!options_.timing) return Status::InvalidArgument("the engine was created without timing");
  EventHandle start = nullptr, copied = nullptr;
  {
    MutexLock lock(mu_);
    Slot* slot = InFlight(batch);
    if (slot == nullptr) return Status::InvalidArgument("CopyMilliseconds: not a batch in flight");
    start = slot->copy_start.get();
    copied = slot->copied.get();
  }
  STOKER_RETURN_IF_ERROR(runtime_.SynchronizeEvent(copied));
  return runtime_.ElapsedMilliseconds(start, copied);
}

}  // namespace stoker::device
