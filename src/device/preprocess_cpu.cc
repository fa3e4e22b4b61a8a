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

}  // namespace stoker::device
