// A DeviceLoader over any DeviceRuntime: tests pass a recording fake.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "device/jpeg_decoder.h"
#include "device/runtime.h"
#include "stoker/device_loader.h"

namespace stoker::device {

[[nodiscard]] Result<std::unique_ptr<DeviceLoader>> CreateDeviceLoader(std::shared_ptr<const Dataset> dataset,
                                                                       const LoaderOptions& options,
                                                                       DeviceRuntime& runtime, int device_index,
                                                                       const DeviceLoaderOptions& device_options);

// Opens the device's JPEG decoder (decode_on_device): nullptr and why when none.
using OpenJpegDecoder = std::function<std::unique_ptr<DeviceJpegDecoder>(std::string* why)>;

// The same, with the decoder a test chooses.
[[nodiscard]] Result<std::unique_ptr<DeviceLoader>> CreateDeviceLoader(std::shared_ptr<const Dataset> dataset,
                                                                       const LoaderOptions& options,
                                                                       DeviceRuntime& runtime, int device_index,
                                                                       const DeviceLoaderOptions& device_options,
                                                                       const OpenJpegDecoder& open_decoder);

}  // namespace stoker::device
