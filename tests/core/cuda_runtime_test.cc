// What CudaRuntime says when it cannot pin buffers: a machine without
// NVIDIA's driver is told so, not that its driver is too old (the CUDA
// runtime's own words there).
#include "core/cuda_runtime.h"

#include <dlfcn.h>

#include <gtest/gtest.h>

namespace stoker {
namespace {

TEST(CudaRuntime, AMachineWithoutTheDriverIsToldItHasNone) {
  void* driver = ::dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (driver == nullptr) {
    EXPECT_EQ(NoUsableCudaDevice("CUDA driver version is insufficient for CUDA runtime version"),
              "no CUDA device: no NVIDIA driver on this machine (libcuda.so.1 does not load)");
    EXPECT_FALSE(CudaRuntime::Get().available());
    EXPECT_EQ(CudaRuntime::Get().reason().find("insufficient"), std::string::npos) << CudaRuntime::Get().reason();
  } else {  // a GPU machine: the runtime's own words are kept
    ::dlclose(driver);
    EXPECT_EQ(NoUsableCudaDevice("out of memory"), "no usable CUDA device (out of memory)");
  }
}

}  // namespace
}  // namespace stoker
