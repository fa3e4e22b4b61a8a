#include "core/cuda_runtime.h"

#include <dlfcn.h>
#if defined(STOKER_WITH_CUDA)
#include <cuda_runtime_api.h>
#endif

#include <cstdlib>

#include <fmt/format.h>

namespace stoker {

std::string NoUsableCudaDevice(std::string_view error) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) return "no CUDA device: no NVIDIA driver on this machine (libcuda.so.1 does not load)";
  ::dlclose(driver);
  return fmt::format("no usable CUDA device ({})", error);
}

const CudaRuntime& CudaRuntime::Get() {
  static const CudaRuntime* runtime = new CudaRuntime();  // never destroyed: used until exit
  return *runtime;
}

CudaRuntime::CudaRuntime() {
  if (const char* off = std::getenv("STOKER_DISABLE_CUDA"); off != nullptr && *off != '\0' && *off != '0') {
    reason_ = "disabled by STOKER_DISABLE_CUDA";
    return;
  }
#if defined(STOKER_WITH_CUDA)
  // Built with CUDA: use the statically linked runtime, the same one the
  // device path copies with, so pinned buffers are pinned for it.
  host_alloc_ = [](void** p, std::size_t bytes, unsigned flags) {
    return static_cast<int>(cudaHostAlloc(p, bytes, flags));
  };
  free_host_ = [](void* p) { return static_cast<int>(cudaFreeHost(p)); };
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    reason_ = err != cudaSuccess ? NoUsableCudaDevice(cudaGetErrorString(err)) : "no CUDA device";
    return;
  }
  available_ = true;
#else
  for (const char* name : {"libcudart.so.13", "libcudart.so.12", "libcudart.so"}) {
    library_ = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library_ != nullptr) break;
  }
  if (library_ == nullptr) {
    reason_ = "the CUDA runtime (libcudart) is not installed";
    return;
  }
  auto device_count = reinterpret_cast<int (*)(int*)>(::dlsym(library_, "cudaGetDeviceCount"));
  auto error_string = reinterpret_cast<const char* (*)(int)>(::dlsym(library_, "cudaGetErrorString"));
  host_alloc_ = reinterpret_cast<int (*)(void**, std::size_t, unsigned)>(::dlsym(library_, "cudaHostAlloc"));
  free_host_ = reinterpret_cast<int (*)(void*)>(::dlsym(library_, "cudaFreeHost"));
  if (device_count == nullptr || host_alloc_ == nullptr || free_host_ == nullptr) {
    reason_ = "libcudart lacks cudaGetDeviceCount/cudaHostAlloc/cudaFreeHost";
    return;
  }
  int count = 0;
  const int err = device_count(&count);
  if (err != 0 || count == 0) {
    reason_ = err != 0 ? NoUsableCudaDevice(error_string ? error_string(err) : "error") : "no CUDA device";
    return;
  }
  available_ = true;
#endif
}

void* CudaRuntime::HostAlloc(std::size_t bytes) const {
  if (!available_) return nullptr;
  void* p = nullptr;
  constexpr unsigned kPortable = 1;  // cudaHostAllocPortable: pinned for every context
  return host_alloc_(&p, bytes, kPortable) == 0 ? p : nullptr;
}

void CudaRuntime::HostFree(void* p) const {
  if (available_ && p != nullptr) free_host_(p);
}

}  // namespace stoker
