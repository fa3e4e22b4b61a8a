// The transfer engine: batches move from host (page-locked) buffers into a
// pool of device buffers on a dedicated copy stream, optionally finished
// there by the preprocessing kernel, and reach the consumer's stream through
// events. Batch k+1 copies while the consumer computes on batch k; the host
// never waits for a copy on the consumer's path, and nothing runs on the
// default stream.
//
// Ordering, per pool slot:
//   copy stream:     [wait slot.released] copy -> record slot.copied -> [JPEG decode] -> [kernel] -> record slot.ready
//   consumer stream: wait slot.ready -> ... compute ... -> record slot.released (Release)
// so a slot is overwritten only after the consumer's work on it completed.
//
// Thread-safe: one thread may submit (copy, decode and kernel enqueued
// without the engine's lock: the reserved slot is that thread's alone) while
// another waits on and releases batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/mutex.h"
#include "device/runtime.h"
#include "stoker/status.h"

namespace stoker::device {

struct TransferOptions {
  // Largest host batch (bytes) to copy.
  std::size_t input_bytes = 0;
  // With preprocessing: bytes of the kernel's output per batch (0: none;
  // the device batch is the copied input itself).
  std::size_t output_bytes = 0;
  // Device buffers in the pool (>= 2: double buffering).
  std::uint32_t buffers = 2;
  // Record timing events around each copy (for copy-time figures).
  bool timing = false;
  // Bytes of each slot's decode area, where the GPU's JPEG decoder writes
  // whole images for the kernel (0: none).
  std::size_t decode_bytes = 0;
  // Bytes of each slot's staging area for the augmentation kernels (an
  // output-sized RGB image per sample; 0: none).
  std::size_t staging_bytes = 0;
};

// What the kernel needs to finish a batch on the device. The host batch
// holds `count` ImageDesc records followed by the pixels they describe.
struct PreprocessJob {
  std::int32_t count = 0;
  OutputDesc output;
  std::uint64_t pixels_offset = 0;  // where the pixel area starts in the host batch
  // Where `count` AugmentDesc records start in the host batch, when the
  // augmentation kernels finish it (needs staging_bytes); -1: the plain kernel.
  std::int64_t augment_offset = -1;
  // GPU decode: called after the copy is enqueued and before the kernel,
  // with the slot's decode area, the slot's copy of the host batch (device
  // memory: the ImageDesc records the kernel reads, which the decode may
  // rewrite on the stream) and the copy stream; it enqueues the decoding of
  // the batch's compressed images there.
  std::function<Status(std::uint8_t* decode_area, std::byte* device_batch, StreamHandle stream)> decode;
};

struct DeviceBatch {
  std::uint32_t slot = 0;
  void* data = nullptr;  // the batch on the device: the kernel's output, or the copied input
  std::size_t bytes = 0;
  std::uint64_t sequence = 0;  // submission order
};

class TransferEngine {
 public:
  [[nodiscard]] static Result<std::unique_ptr<TransferEngine>> Create(DeviceRuntime& runtime,
                                                                      const TransferOptions& options);
  // Waits for the work in flight, then frees the pool.
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Enqueues `host` into a free slot. ResourceExhausted when the consumer
  // holds every slot (waiting would never end). The host bytes must stay
  // unchanged until WaitCopied(batch) returns.
  [[nodiscard]] Result<DeviceBatch> Submit(std::span<const std::byte> host, const PreprocessJob* job = nullptr);
  // Makes `consumer` wait, on the GPU, until the batch is ready.
  [[nodiscard]] Status WaitOn(const DeviceBatch& batch, StreamHandle consumer);
  // The host waits until the batch's copy finished, so that its host buffer
  // can be reused. Cheap when called a batch later, as the loader does.
  [[nodiscard]] Status WaitCopied(const DeviceBatch& batch);
  // The consumer is done with the batch once `consumer`'s work enqueued so
  // far completes; the slot returns to the pool (reused after that, GPU-side).
  [[nodiscard]] Status Release(const DeviceBatch& batch, StreamHandle consumer);
  // A submitted batch no consumer will see (dropped from a look-ahead): its
  // slot returns to the pool; the copy stream's order keeps its work before
  // the slot's next use.
  [[nodiscard]] Status Abandon(const DeviceBatch& batch);
  // Milliseconds the copy of `batch` took (timing = true), measured by events.
  [[nodiscard]] Result<float> CopyMilliseconds(const DeviceBatch& batch);

  // The event recorded when the batch's copy finished (for measurements).
  [[nodiscard]] EventHandle copied_event(const DeviceBatch& batch) const;
  [[nodiscard]] StreamHandle copy_stream() const;
  [[nodiscard]] std::uint32_t free_slots() const;

  struct Slot;

 private:
  TransferEngine(DeviceRuntime& runtime, TransferOptions options);
  // The slot of `batch` when it is the one in flight there (mu_ held).
  Slot* InFlight(const DeviceBatch& batch) const REQUIRES(mu_);

  DeviceRuntime& runtime_;
  TransferOptions options_;
  Stream copy_stream_;
  std::vector<std::unique_ptr<Slot>> slots_;  // the vector is fixed after Create; each Slot's state is under mu_
  mutable Mutex mu_;
  std::uint64_t submitted_ GUARDED_BY(mu_) = 0;
  std::uint32_t next_slot_ GUARDED_BY(mu_) = 0;
};

}  // namespace stoker::device
