// The few NVML types and entry points the interposer uses and hooks.
#pragma once

#include <cstdint>

#include "share/nvml_types.h"

extern "C" {
enum : int { kNvmlSuccess = 0, kNvmlErrorInvalidArgument = 2, kNvmlErrorInsufficientSize = 7 };

// The interposer's NVML hooks (hooks_report.cc).
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory);
}

namespace stoker::share {
inline constexpr unsigned int kNvmlMemoryV2Version = static_cast<unsigned int>(sizeof(nvmlMemory_v2_t)) | (2u << 24);
inline constexpr unsigned int kNvmlUuidBytes = 96;

using NvmlInitFn = nvmlReturn_t (*)();
using NvmlGetHandleByUuidFn = nvmlReturn_t (*)(const char*, nvmlDevice_t*);
using NvmlGetUuidFn = nvmlReturn_t (*)(nvmlDevice_t, char*, unsigned int);
using NvmlGetMemoryInfoFn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*);
using NvmlGetMemoryInfoV2Fn = nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_v2_t*);
using NvmlGetProcessesFn = nvmlReturn_t (*)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*);
}  // namespace stoker::share
