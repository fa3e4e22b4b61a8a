// The fused preprocessing kernel: one thread per output pixel, all channels;
// blockIdx.y is the image. The arithmetic is PreprocessPixel, shared with the
// CPU twin.
#include <cuda_runtime.h>

#include "device/cuda/preprocess_kernel.h"

namespace stoker::device {
namespace {

__global__ void PreprocessKernel(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images, OutputDesc output, char* out,
                                 std::uint64_t out_image_bytes) {
  const std::int32_t image = static_cast<std::int32_t>(blockIdx.y);
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t plane = static_cast<std::int64_t>(output.width) * output.height;
  if (p >= plane) return;
  const ImageDesc desc = images[image];
  PreprocessPixel(pixels, decoded, desc, output, static_cast<std::int32_t>(p % output.width),
                  static_cast<std::int32_t>(p / output.width), out + image * out_image_bytes);
}

}  // namespace

int LaunchPreprocessKernel(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images, std::int32_t count,
                           const OutputDesc& output, void* out, std::uint64_t out_image_bytes, void* stream) {
  if (count <= 0) return 0;
  constexpr int kThreads = 256;
  const std::int64_t plane = static_cast<std::int64_t>(output.width) * output.height;
  const dim3 grid(static_cast<unsigned>((plane + kThreads - 1) / kThreads), static_cast<unsigned>(count));
  PreprocessKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(pixels, decoded, images, output,
                                                                             static_cast<char*>(out), out_image_bytes);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace stoker::device
