// A kernel that keeps the GPU busy for a while: the "compute" that copies
// must overlap with in the GPU tests.
#include <cuda_runtime.h>

#include <cstdint>

namespace {
__global__ void Spin(std::int64_t cycles, int* sink) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}
}  // namespace

int LaunchSpin(std::int64_t cycles, int* device_sink, void* stream) {
  Spin<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(cycles, device_sink);
  return static_cast<int>(cudaGetLastError());
}
