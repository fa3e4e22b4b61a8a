// stoker/device.h: where tensors live, and whether a GPU can be used.
//
// stoker uses CUDA only when it was built with it and a device is actually
// present; everywhere else it says why and uses the CPU, never failing to
// load. Memory kinds: host pageable, host pinned (page-locked, for
// asynchronous copies), device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker {

enum class DeviceKind : std::uint8_t { kCpu, kCuda };
enum class MemoryKind : std::uint8_t { kHostPageable, kHostPinned, kDevice };

struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int index = 0;  // cuda:N
  [[nodiscard]] std::string ToString() const;
  friend bool operator==(const Device&, const Device&) = default;
};

// "cpu", "cuda" (= cuda:0) or "cuda:N".
[[nodiscard]] Result<Device> ParseDevice(std::string_view text);

struct CudaAvailability {
  bool built_with_cuda = false;
  int device_count = 0;
  std::string reason;  // why CUDA is not used, when device_count == 0
};
[[nodiscard]] CudaAvailability QueryCuda();

struct ResolvedDevice {
  Device device;
  std::string note;  // set when the request could not be honoured, e.g. "no GPU: using the CPU"
};
// The device to use for `requested`: a CUDA request falls back to the CPU
// (with a note saying why) where CUDA is unavailable; asking for cuda:N with
// fewer devices present is an error.
[[nodiscard]] Result<ResolvedDevice> ResolveDevice(std::string_view requested);

}  // namespace stoker
