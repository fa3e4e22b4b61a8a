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

__global__ void ResizeToStagingKernel(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                                      const AugmentDesc* augments, OutputDesc output, std::uint8_t* staging) {
  const std::int32_t image = static_cast<std::int32_t>(blockIdx.y);
  const std::int64_t p = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::int64_t plane = static_cast<std::int64_t>(output.width) * output.height;
  if (p >= plane) return;
  ResizeToStaging(pixels, decoded, images[image], augments[image], output, static_cast<std::int32_t>(p % output.width),
                  static_cast<std::int32_t>(p / output.width), staging + image * plane * 3);
}

// One block per image: each colour op over the whole staging image (a
// contrast first sums the luma), then the final write. The launch bound
// keeps the registers within what a block of this size may have.
constexpr int kColourThreads = 512;

__global__ void __launch_bounds__(kColourThreads) ColourAndWriteKernel(const AugmentDesc* augments, OutputDesc output, std::uint8_t* staging, char* out,
                                     std::uint64_t out_image_bytes) {
  __shared__ unsigned long long luma_sum;
  const std::int32_t image = static_cast<std::int32_t>(blockIdx.x);
  const AugmentDesc& a = augments[image];
  const std::int64_t plane = static_cast<std::int64_t>(output.width) * output.height;
  std::uint8_t* stage = staging + image * plane * 3;
  for (std::int32_t i = 0; i < a.op_count && i < kMaxPixelOps; ++i) {
    const PixelOpDesc op = a.ops[i];
    std::uint8_t mean = 0;
    if (op.kind == kOpContrast) {
      if (threadIdx.x == 0) luma_sum = 0;
      __syncthreads();
      unsigned long long mine = 0;
      for (std::int64_t p = threadIdx.x; p < plane; p += blockDim.x) mine += PillowLuma(stage + p * 3);
      atomicAdd(&luma_sum, mine);
      __syncthreads();
      mean = ContrastMean(luma_sum, static_cast<std::uint64_t>(plane));
    }
    for (std::int64_t p = threadIdx.x; p < plane; p += blockDim.x) ApplyPixelOp(op, mean, stage + p * 3);
    __syncthreads();
  }
  char* dst = out + image * out_image_bytes;
  for (std::int64_t p = threadIdx.x; p < plane; p += blockDim.x)
    WriteAugmented(stage, a, output, static_cast<std::int32_t>(p % output.width),
                   static_cast<std::int32_t>(p / output.width), dst);
}

}  // namespace

int LaunchAugmentKernels(const std::uint8_t* pixels, const std::uint8_t* decoded, const ImageDesc* images,
                         const AugmentDesc* augments, std::int32_t count, const OutputDesc& output,
                         std::uint8_t* staging, void* out, std::uint64_t out_image_bytes, void* stream) {
  if (count <= 0) return 0;
  constexpr int kThreads = 256;
  const std::int64_t plane = static_cast<std::int64_t>(output.width) * output.height;
  const auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(static_cast<unsigned>((plane + kThreads - 1) / kThreads), static_cast<unsigned>(count));
  ResizeToStagingKernel<<<grid, kThreads, 0, s>>>(pixels, decoded, images, augments, output, staging);
  const cudaError_t first = cudaGetLastError();
  if (first != cudaSuccess) return static_cast<int>(first);
  ColourAndWriteKernel<<<static_cast<unsigned>(count), kColourThreads, 0, s>>>(augments, output, staging, static_cast<char*>(out),
                                                                    out_image_bytes);
  return static_cast<int>(cudaGetLastError());
}

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
