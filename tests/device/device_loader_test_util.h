// One epoch out of a DeviceLoader over the fake runtime (whose "device"
// memory is host memory): the float32 images, indices and labels, each batch
// released once read.
#pragma once

#include <gtest/gtest.h>

#include "pipeline/loader_test_util.h"
#include "stoker/device_loader.h"

namespace stoker {

inline Epoch DrainDeviceEpoch(DeviceLoader& loader) {
  Epoch e;
  auto consumer = reinterpret_cast<void*>(std::uintptr_t{77});
  while (true) {
    auto next = loader.Next(consumer);
    EXPECT_TRUE(next.ok()) << next.error().ToString();
    if (!next.ok() || !next->has_value()) break;
    const DeviceBatchView& b = **next;
    const auto bytes = static_cast<std::size_t>(b.shape[0] * b.shape[1] * b.shape[2] * b.shape[3]) * 4;
    e.indices.insert(e.indices.end(), b.indices.begin(), b.indices.end());
    e.labels.insert(e.labels.end(), b.labels.begin(), b.labels.end());
    auto* p = static_cast<const std::byte*>(b.images);
    e.pixels.insert(e.pixels.end(), p, p + bytes);
    EXPECT_TRUE(loader.Release(b, consumer).ok());
  }
  return e;
}

}  // namespace stoker
