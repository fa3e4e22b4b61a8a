#include "device/preprocess_cpu.h"

namespace stoker::device {

void PreprocessOnCpu(const std::uint8_t* pixels, std::span<const ImageDesc> images, const OutputDesc& output, void* out,
                     const std::uint8_t* decoded) {
  const std::uint64_t image_bytes = OutputImageBytes(output);
  for (std::size_t k = 0; k < images.size(); ++k) {
    char* dst = static_cast<char*>(out) + k * image_bytes;
    for (std::int32_t y = 0; y < output.height; ++y)
      for (std::int32_t x = 0; x < output.width; ++x) PreprocessPixel(pixels, decoded, images[k], output, x, y, dst);
  }
}

void AugmentOnCpu(const std::uint8_t* pixels, std::span<const ImageDesc> images, const AugmentDesc* augments,
                  const OutputDesc& output, std::uint8_t* staging, void* out, const std::uint8_t* decoded) {
  const std::uint64_t image_bytes = OutputImageBytes(output);
  const std::uint64_t staging_bytes = static_cast<std::uint64_t>(output.width) * output.height * 3;
  const std::uint64_t n = static_cast<std::uint64_t>(output.width) * output.height;
  for (std::size_t k = 0; k < images.size(); ++k) {
    const AugmentDesc& a = augments[k];
    std::uint8_t* stage = staging + k * staging_bytes;
    for (std::int32_t y = 0; y < output.height; ++y)
      for (std::int32_t x = 0; x < output.width; ++x)
        ResizeToStaging(pixels, decoded, images[k], a, output, x, y, stage);
    for (std::int32_t i = 0; i < a.op_count && i < kMaxPixelOps; ++i) {
      std::uint8_t mean = 0;
      if (a.ops[i].kind == kOpContrast) {
        std::uint64_t sum = 0;
        for (std::uint64_t p = 0; p < n; ++p) sum += PillowLuma(stage + p * 3);
        mean = ContrastMean(sum, n);
      }
      for (std::uint64_t p = 0; p < n; ++p) ApplyPixelOp(a.ops[i], mean, stage + p * 3);
    }
    char* dst = static_cast<char*>(out) + k * image_bytes;
    for (std::int32_t y = 0; y < output.height; ++y)
      for (std::int32_t x = 0; x < output.width; ++x) WriteAugmented(stage, a, output, x, y, dst);
  }
}

}  // namespace stoker::device
