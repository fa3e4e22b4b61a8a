// OpenNvjpegDecoder() for CUDA builds configured without nvjpeg.h.
#include "device/jpeg_decoder.h"

namespace stoker::device {

std::unique_ptr<DeviceJpegDecoder> OpenNvjpegDecoder(std::string* why) {
  if (why != nullptr)
    *why = "stoker was built without nvjpeg.h (run scripts/deps, or set NVJPEG_ROOT, and configure again)";
  return nullptr;
}

}  // namespace stoker::device
