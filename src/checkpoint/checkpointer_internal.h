// A Checkpointer over chosen seams: tests pass a recording device runtime
// and a fake clock.
#pragma once

#include <memory>

#include "core/clock.h"
#include "device/runtime.h"
#include "stoker/checkpoint.h"

namespace stoker::checkpoint {

struct CheckpointerSeams {
  device::DeviceRuntime* device_runtime = nullptr;  // nullptr: the CUDA runtime when one is usable
  Clock* clock = nullptr;                           // nullptr: the real clock
};

[[nodiscard]] Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(CheckpointOptions options,
                                                                     const CheckpointerSeams& seams);

}  // namespace stoker::checkpoint
