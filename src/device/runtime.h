// The seam between stoker and a GPU runtime. The transfer engine and the GPU
// preprocessing talk to a DeviceRuntime, never to CUDA directly, so that
// their ordering logic (which stream copies, which event the consumer waits
// on, when a buffer may be reused) is tested on machines without a GPU
// through a recording fake, and the real CUDA runtime (device/cuda_runtime_api.cc,
// built only with CUDA) stays a thin translation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "device/preprocess_math.h"
#include "stoker/status.h"

namespace stoker::device {

struct AugmentDesc;  // device/augment_math.h (the augmentation kernels' per-image record)

// Opaque handles (cudaStream_t, cudaEvent_t underneath).
using StreamHandle = void*;
using EventHandle = void*;

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual int device_count() const = 0;
  // The calling thread's current device (what SetDevice changes).
  [[nodiscard]] virtual Result<int> CurrentDevice() = 0;
  [[nodiscard]] virtual Status SetDevice(int device) = 0;

  [[nodiscard]] virtual Result<void*> DeviceAlloc(std::size_t bytes) = 0;
  virtual void DeviceFree(void* p) = 0;
  [[nodiscard]] virtual Result<void*> PinnedAlloc(std::size_t bytes) = 0;
  virtual void PinnedFree(void* p) = 0;

  [[nodiscard]] virtual Result<StreamHandle> CreateStream() = 0;
  virtual void DestroyStream(StreamHandle stream) = 0;
  [[nodiscard]] virtual Result<EventHandle> CreateEvent(bool timing) = 0;
  virtual void DestroyEvent(EventHandle event) = 0;

  [[nodiscard]] virtual Status CopyToDeviceAsync(void* device_dst, const void* host_src, std::size_t bytes,
                                                 StreamHandle stream) = 0;
  [[nodiscard]] virtual Status CopyToHostAsync(void* host_dst, const void* device_src, std::size_t bytes,
                                               StreamHandle stream) = 0;
  // The host waits for all work on `stream`.
  [[nodiscard]] virtual Status SynchronizeStream(StreamHandle stream) = 0;
  [[nodiscard]] virtual Status RecordEvent(EventHandle event, StreamHandle stream) = 0;
  // Work later enqueued on `stream` starts after `event` completes; the host does not wait.
  [[nodiscard]] virtual Status StreamWaitEvent(StreamHandle stream, EventHandle event) = 0;
  // The host waits for `event`.
  [[nodiscard]] virtual Status SynchronizeEvent(EventHandle event) = 0;
  [[nodiscard]] virtual Result<float> ElapsedMilliseconds(EventHandle start, EventHandle end) = 0;

  // `device_decoded`: the GPU JPEG decoder's output area (images whose
  // source is 1), or null.
  [[nodiscard]] virtual Status LaunchPreprocess(const std::uint8_t* device_pixels, const std::uint8_t* device_decoded,
                                                const ImageDesc* device_images, std::int32_t count,
                                                const OutputDesc& output, void* device_out, StreamHandle stream) = 0;
  // The augmentation kernels (device/augment_math.h): stage 1 resizes each
  // image (through its warps) into `device_staging` (output-sized RGB, one
  // per image), stage 2 runs its colour ops there and writes the output.
  [[nodiscard]] virtual Status LaunchAugment(const std::uint8_t* device_pixels, const std::uint8_t* device_decoded,
                                             const ImageDesc* device_images, const AugmentDesc* device_augments,
                                             std::int32_t count, const OutputDesc& output, std::uint8_t* device_staging,
                                             void* device_out, StreamHandle stream) = 0;
};

// The CUDA runtime when stoker was built with CUDA and a device is usable;
// otherwise nullptr and `why` says which of the two is missing. Never
// crashes on a machine without a driver.
[[nodiscard]] DeviceRuntime* CudaDeviceRuntime(std::string* why = nullptr);

// RAII owners over a runtime's resources. Each frees what it owns on
// destruction; moves transfer ownership.
template <typename Handle, void (DeviceRuntime::*Free)(Handle)>
class Owned {
 public:
  Owned() = default;
  Owned(DeviceRuntime* runtime, Handle handle) : runtime_(runtime), handle_(handle) {}
  Owned(Owned&& o) noexcept : runtime_(o.runtime_), handle_(std::exchange(o.handle_, Handle{})) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      runtime_ = o.runtime_;
      handle_ = std::exchange(o.handle_, Handle{});
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { reset(); }
  void reset() {
    if (handle_ != Handle{}) (runtime_->*Free)(handle_);
    handle_ = Handle{};
  }
  [[nodiscard]] Handle get() const { return handle_; }

 private:
  DeviceRuntime* runtime_ = nullptr;
  Handle handle_{};
};

using Stream = Owned<StreamHandle, &DeviceRuntime::DestroyStream>;
using Event = Owned<EventHandle, &DeviceRuntime::DestroyEvent>;
using DeviceMemory = Owned<void*, &DeviceRuntime::DeviceFree>;
using PinnedMemory = Owned<void*, &DeviceRuntime::PinnedFree>;

[[nodiscard]] inline Result<Stream> MakeStream(DeviceRuntime& r) {
  STOKER_ASSIGN_OR_RETURN(StreamHandle h, r.CreateStream());
  return Stream(&r, h);
}
[[nodiscard]] inline Result<Event> MakeEvent(DeviceRuntime& r, bool timing = false) {
  STOKER_ASSIGN_OR_RETURN(EventHandle h, r.CreateEvent(timing));
  return Event(&r, h);
}
[[nodiscard]] inline Result<DeviceMemory> MakeDeviceMemory(DeviceRuntime& r, std::size_t bytes) {
  STOKER_ASSIGN_OR_RETURN(void* p, r.DeviceAlloc(bytes));
  return DeviceMemory(&r, p);
}

}  // namespace stoker::device
