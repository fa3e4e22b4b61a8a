// CudaDeviceRuntime() for builds without CUDA (STOKER_CUDA=OFF or no nvcc).
#include "device/jpeg_decoder.h"
#include "device/runtime.h"

namespace stoker::device {

DeviceRuntime* CudaDeviceRuntime(std::string* why) {
  if (why != nullptr) *why = "stoker was built without CUDA (configure with nvcc on PATH, or -DSTOKER_CUDA=ON)";
  return nullptr;
}

std::unique_ptr<DeviceJpegDecoder> OpenNvjpegDecoder(std::string* why) {
  if (why != nullptr) *why = "stoker was built without CUDA, so it cannot decode JPEGs on a GPU";
  return nullptr;
}

}  // namespace stoker::device
