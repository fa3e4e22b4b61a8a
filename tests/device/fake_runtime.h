// A DeviceRuntime for machines without a GPU: "device" memory is host
// memory, work runs at once, and every call is logged with the stream or
// event it used, so tests can check the order the transfer engine asks for.
// Thread-safe (the device loader's staging thread submits while the test's
// thread waits on and releases batches); read `log` once they are done.
#pragma once

#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "device/preprocess_cpu.h"
#include "device/runtime.h"

namespace stoker::testing {

class FakeDeviceRuntime : public device::DeviceRuntime {
 public:
  std::vector<std::string> log;
  int live_device_allocations = 0, live_streams = 0, live_events = 0;
  int fail_device_alloc_after = -1;  // the Nth DeviceAlloc fails (0-based); -1: never
  int device_allocs = 0;

  std::string name() const override { return "fake"; }
  int device_count() const override { return 1; }
  int current_device = 0;
  Result<int> CurrentDevice() override {
    std::lock_guard<std::mutex> lock(mu_);
    return current_device;
  }
  Status SetDevice(int device) override {
    std::lock_guard<std::mutex> lock(mu_);
    current_device = device;
    return Status::Ok();
  }

  Result<void*> DeviceAlloc(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (fail_device_alloc_after >= 0 && device_allocs >= fail_device_alloc_after)
      return Status::ResourceExhausted(fmt::format("fake device out of memory ({} bytes)", bytes));
    ++device_allocs;
    ++live_device_allocations;
    void* p = ::operator new(bytes);
    device_memory_[p] = bytes;
    return p;
  }
  void DeviceFree(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    device_memory_.erase(p);
    --live_device_allocations;
    ::operator delete(p);
  }
  Result<void*> PinnedAlloc(std::size_t bytes) override { return ::operator new(bytes); }
  void PinnedFree(void* p) override { ::operator delete(p); }

  Result<device::StreamHandle> CreateStream() override {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_streams;
    return reinterpret_cast<device::StreamHandle>(static_cast<std::uintptr_t>(++next_id_));
  }
  void DestroyStream(device::StreamHandle) override {
    std::lock_guard<std::mutex> lock(mu_);
    --live_streams;
  }
  Result<device::EventHandle> CreateEvent(bool) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++live_events;
    return reinterpret_cast<device::EventHandle>(static_cast<std::uintptr_t>(1000 + ++next_id_));
  }
  void DestroyEvent(device::EventHandle) override {
    std::lock_guard<std::mutex> lock(mu_);
    --live_events;
  }

  Status CopyToDeviceAsync(void* dst, const void* src, std::size_t bytes, device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!IsDeviceMemory(dst, bytes)) return Status::Internal("copy into memory that is not device memory");
    std::memcpy(dst, src, bytes);
    log.push_back(fmt::format("copy {} bytes on stream {}", bytes, Id(s)));
    return Status::Ok();
  }
  Status CopyToHostAsync(void* dst, const void* src, std::size_t bytes, device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!IsDeviceMemory(src, bytes)) return Status::Internal("copy from memory that is not device memory");
    std::memcpy(dst, src, bytes);
    log.push_back(fmt::format("copy {} bytes to host on stream {}", bytes, Id(s)));
    return Status::Ok();
  }
  Status SynchronizeStream(device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(fmt::format("host waits for stream {}", Id(s)));
    return Status::Ok();
  }
  Status RecordEvent(device::EventHandle e, device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(fmt::format("record event {} on stream {}", Id(e), Id(s)));
    return Status::Ok();
  }
  Status StreamWaitEvent(device::StreamHandle s, device::EventHandle e) override {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(fmt::format("stream {} waits for event {}", Id(s), Id(e)));
    return Status::Ok();
  }
  Status SynchronizeEvent(device::EventHandle e) override {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(fmt::format("host waits for event {}", Id(e)));
    return Status::Ok();
  }
  Result<float> ElapsedMilliseconds(device::EventHandle, device::EventHandle) override { return 0.5f; }
  Status LaunchPreprocess(const std::uint8_t* pixels, const std::uint8_t* decoded, const device::ImageDesc* images,
                          std::int32_t count, const device::OutputDesc& output, void* out,
                          device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    // The fake GPU runs the CPU twin.
    device::PreprocessOnCpu(pixels, std::span(images, static_cast<std::size_t>(count)), output, out, decoded);
    log.push_back(fmt::format("preprocess {} images on stream {}", count, Id(s)));
    return Status::Ok();
  }

  Status LaunchAugment(const std::uint8_t* pixels, const std::uint8_t* decoded, const device::ImageDesc* images,
                       const device::AugmentDesc* augments, std::int32_t count, const device::OutputDesc& output,
                       std::uint8_t* staging, void* out, device::StreamHandle s) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!IsDeviceMemory(staging, static_cast<std::size_t>(count) * output.width * output.height * 3))
      return Status::Internal("augmentation staging that is not device memory");
    device::AugmentOnCpu(pixels, std::span(images, static_cast<std::size_t>(count)), augments, output, staging, out,
                         decoded);
    log.push_back(fmt::format("augment {} images on stream {}", count, Id(s)));
    return Status::Ok();
  }

  // A line in the log from a test double beside the runtime (the fake JPEG decoder).
  void Log(std::string line) {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(std::move(line));
  }

  static std::uintptr_t Id(void* h) { return reinterpret_cast<std::uintptr_t>(h); }

  // [p, p + bytes) lies inside one device allocation (called with mu_ held, or with no other thread about).
  bool IsDeviceMemory(const void* p, std::size_t bytes) const {
    const auto* at = static_cast<const char*>(p);
    auto it = device_memory_.upper_bound(const_cast<void*>(p));
    if (it == device_memory_.begin()) return false;
    --it;
    const auto* base = static_cast<const char*>(it->first);
    return at >= base && at + bytes <= base + it->second;
  }

 private:
  std::mutex mu_;
  std::uintptr_t next_id_ = 0;
  std::map<void*, std::size_t> device_memory_;  // allocation -> bytes
};

}  // namespace stoker::testing
