#include "stoker/device.h"

#include <charconv>

#include <fmt/format.h>

#include "device/runtime.h"

namespace stoker {

std::string Device::ToString() const {
  return kind == DeviceKind::kCpu ? "cpu" : fmt::format("cuda:{}", index);
}

Result<Device> ParseDevice(std::string_view text) {
  if (text == "cpu") return Device{DeviceKind::kCpu, 0};
  if (text == "cuda") return Device{DeviceKind::kCuda, 0};
  if (text.starts_with("cuda:")) {
    std::string_view n = text.substr(5);
    int index = -1;
    auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), index);
    if (ec == std::errc() && end == n.data() + n.size() && index >= 0 && !n.empty())
      return Device{DeviceKind::kCuda, index};
  }
  return Status::InvalidArgument(fmt::format("device '{}' is not 'cpu', 'cuda' or 'cuda:N'", text));
}

CudaAvailability QueryCuda() {
  CudaAvailability a;
  std::string why;
  device::DeviceRuntime* runtime = device::CudaDeviceRuntime(&why);
#if defined(STOKER_WITH_CUDA)
  a.built_with_cuda = true;
#endif
  a.device_count = runtime != nullptr ? runtime->device_count() : 0;
  a.reason = why;
  return a;
}

Result<ResolvedDevice> ResolveDevice(std::string_view requested) {
  STOKER_ASSIGN_OR_RETURN(Device d, ParseDevice(requested));
  if (d.kind == DeviceKind::kCpu) return ResolvedDevice{d, ""};
  const CudaAvailability cuda = QueryCuda();
  if (cuda.device_count == 0)
    return ResolvedDevice{Device{DeviceKind::kCpu, 0},
                          fmt::format("{} requested but {}: using the CPU", d.ToString(), cuda.reason)};
  if (d.index >= cuda.device_count)
    return Status::InvalidArgument(
        fmt::format("{} requested but only {} CUDA device(s) present", d.ToString(), cuda.device_count));
  return ResolvedDevice{d, ""};
}

}  // namespace stoker
