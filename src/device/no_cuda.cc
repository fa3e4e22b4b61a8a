// CudaDeviceRuntime() for builds without CUDA (STOKER_CUDA=OFF or no nvcc).
#include "device/runtime.h"

namespace stoker::device {

DeviceRuntime* CudaDeviceRuntime(std::string* why) {
  if (why != nullptr) *why = "stoker was built without CUDA (configure with nvcc on PATH, or -DSTOKER_CUDA=ON)";
  return nullptr;
}

}  // namespace stoker::device
