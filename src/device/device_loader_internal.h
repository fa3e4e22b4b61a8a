// A DeviceLoader over any DeviceRuntime: tests pass a recording fake.
#pragma once

#include <memory>

#include "device/runtime.h"
#include "stoker/device_loader.h"

namespace stoker::device {

[[nodiscard]] Result<std::unique_ptr<DeviceLoader>> CreateDeviceLoader(std::shared_ptr<const Dataset> dataset,
                                                                       const LoaderOptions& options,
                                                                       DeviceRuntime& runtime, int device_index,
                                                                       const DeviceLoaderOptions& device_options);

}  // namespace stoker::device
