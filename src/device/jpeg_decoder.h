// The seam between the GPU decode path and a JPEG decoder on the device:
// nvJPEG, loaded at run time (device/cuda/nvjpeg_decoder.cc), or a test
// double. The decode stage hands it the compressed bytes (host memory) and
// where each image's RGB pixels go (device memory, rows packed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "codec/jpeg_traits.h"
#include "device/runtime.h"
#include "stoker/status.h"

namespace stoker::device {

struct DeviceJpegJob {
  std::span<const std::byte> jpeg;  // host memory, valid until the decode returns
  std::uint8_t* out = nullptr;      // device memory: height rows of width * 3 bytes (RGB)
  int width = 0, height = 0;        // from the header; the decoder checks them
  bool hardware = false;            // planned for the hardware decoder (else the GPU decoder)
};

class DeviceJpegDecoder {
 public:
  virtual ~DeviceJpegDecoder() = default;
  // "nvJPEG 12.4, hardware decoder (1 engine)" and the like.
  [[nodiscard]] virtual std::string name() const = 0;
  [[nodiscard]] virtual codec::GpuDecodeCaps caps() const = 0;
  // Decodes every job, enqueuing the GPU's part on `stream`; the host may
  // return before the pixels are written. A failure says which job
  // (Corruption for a bad image, Unavailable for the decoder itself); the
  // caller then decodes the batch's images one at a time.
  [[nodiscard]] virtual Status DecodeBatch(std::span<const DeviceJpegJob> jobs, StreamHandle stream) = 0;
  // One image through the decoder's most permissive path.
  [[nodiscard]] virtual Status DecodeOne(const DeviceJpegJob& job, StreamHandle stream) = 0;
};

// nvJPEG, loaded at run time (the library named by $STOKER_NVJPEG_LIBRARY,
// else libnvjpeg.so.13 / .so.12 / .so on the loader's path), for `device`
// (the calling thread's current CUDA device). nullptr when there is no
// nvJPEG, no usable GPU, or stoker was built without CUDA or nvjpeg.h, and
// `why` says which.
[[nodiscard]] std::unique_ptr<DeviceJpegDecoder> OpenNvjpegDecoder(std::string* why);

}  // namespace stoker::device
