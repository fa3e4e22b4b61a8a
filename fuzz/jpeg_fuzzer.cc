// Fuzzes the loader's per-sample path on arbitrary bytes: JPEG header,
// crop box, region-of-interest decode with DCT scaling, resample, write.
// Malformed input must give an error, never a crash or an out-of-bounds access.
#include <cstddef>
#include <cstdint>
#include <span>

#include "stoker/loader.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::TransformOptions train;
  train.width = train.height = 32;
  (void)stoker::TransformImage(bytes, train, /*seed=*/data[0], 0, size);
  stoker::TransformOptions eval = train;
  eval.kind = stoker::TransformOptions::Kind::kResizeCenterCrop;
  eval.resize = 40;
  eval.dtype = stoker::DType::kUint8;
  eval.layout = stoker::Layout::kNHWC;
  (void)stoker::TransformImage(bytes, eval, 1, 0, 0);
  return 0;
}
