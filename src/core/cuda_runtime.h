// The CUDA runtime for page-locked host buffers. Built with CUDA, it is the
// statically linked runtime the device path also uses; built without, it is
// libcudart found at run time (dlopen) if installed. Either way stoker loads
// and works on machines without CUDA or without a GPU; when a device is
// present, host buffers are page-locked.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace stoker {

// What to say when cudaGetDeviceCount fails with `error` (its text): on a
// machine without NVIDIA's driver the runtime says "CUDA driver version is
// insufficient for CUDA runtime version", which reads as an old driver, so
// a driver library that does not load is said to be missing instead.
[[nodiscard]] std::string NoUsableCudaDevice(std::string_view error);

class CudaRuntime {
 public:
  // The process-wide instance; probes once (dlopen libcudart, count devices).
  static const CudaRuntime& Get();

  // True when libcudart loaded and at least one device is usable.
  [[nodiscard]] bool available() const { return available_; }
  // Why CUDA is not used, for messages ("libcudart not found", "no device: ...").
  [[nodiscard]] const std::string& reason() const { return reason_; }

  // cudaHostAlloc / cudaFreeHost; nullptr when unavailable or on failure.
  [[nodiscard]] void* HostAlloc(std::size_t bytes) const;
  void HostFree(void* p) const;

 private:
  CudaRuntime();
  bool available_ = false;
  std::string reason_;
  void* library_ = nullptr;
  int (*host_alloc_)(void**, std::size_t, unsigned) = nullptr;
  int (*free_host_)(void*) = nullptr;
};

}  // namespace stoker
