// The few NVML records stoker reads (the toolkit ships no nvml.h; these
// follow NVML's documented ABI): used by the interposer's NVML hooks and by
// the placement inventory, which loads NVML at run time.
#pragma once

extern "C" {
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef int nvmlReturn_t;  // 0: NVML_SUCCESS

struct nvmlMemory_t {
  unsigned long long total, free, used;
};
// Asked for with version = sizeof | 2 << 24; the driver's reserve is apart.
struct nvmlMemory_v2_t {
  unsigned int version;
  unsigned long long total, reserved, free, used;
};
// nvmlDeviceGetComputeRunningProcesses_v3's record.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
};
// nvmlDeviceGetPciInfo_v3's record.
struct nvmlPciInfo_t {
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
}
