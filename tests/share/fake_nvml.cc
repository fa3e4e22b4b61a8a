// A test double of NVML (libnvidia-ml.so.1) over the same fake devices as
// fake_cuda.cc (fake_gpu_state.h): device handles, UUIDs, memory info
// (physical), and each live process's memory, as NVML reports them.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fake_gpu_state.h"
#include "share/nvml_types.h"  // NVML's ABI, as the callers see it (clang's -fsanitize=function checks)

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// A device handle is its index plus one, as a pointer.
int Index(nvmlDevice_t device) {
  const auto i = static_cast<int>(reinterpret_cast<std::uintptr_t>(device)) - 1;
  return i >= 0 && i < static_cast<int>(fake_gpu::Shared()->devices) ? i : -1;
}
nvmlDevice_t HandleOf(int index) {
  return reinterpret_cast<nvmlDevice_t>(static_cast<std::uintptr_t>(index + 1));
}

void Uuid(int d, char* out, unsigned int len) {
  const std::uint8_t* u = fake_gpu::Shared()->uuid[d];
  std::snprintf(out, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2],
                u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

constexpr int kSuccess = 0, kInvalidArgument = 2, kNotFound = 6, kInsufficientSize = 7, kGpuIsLost = 15;

// A device a test marked lost answers every query as a fallen-off card does.
bool Lost(int d) {
  return d >= 0 && fake_gpu::Shared()->lost[d] != 0;
}

}  // namespace

FAKE_EXPORT int nvmlInit_v2() {
  return fake_gpu::Shared() ? kSuccess : 1;
}
FAKE_EXPORT int nvmlShutdown() {
  return kSuccess;
}
FAKE_EXPORT const char* nvmlErrorString(int) {
  return "fake NVML error";
}
// A trailing device a test marked gone (lost == 2) is not counted at all,
// as a card that fell off the bus.
FAKE_EXPORT int nvmlDeviceGetCount_v2(unsigned int* count) {
  unsigned int n = fake_gpu::Shared()->devices;
  while (n > 0 && fake_gpu::Shared()->lost[n - 1] == 2) --n;
  *count = n;
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device) {
  unsigned int count = 0;
  nvmlDeviceGetCount_v2(&count);
  if (index >= count) return kInvalidArgument;
  *device = HandleOf(static_cast<int>(index));
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetHandleByUUID(const char* uuid, nvmlDevice_t* device) {
  for (std::uint32_t d = 0; d < fake_gpu::Shared()->devices; ++d) {
    char text[96];
    Uuid(static_cast<int>(d), text, sizeof(text));
    if (std::strcmp(text, uuid) == 0) {
      *device = HandleOf(static_cast<int>(d));
      return kSuccess;
    }
  }
  return kNotFound;
}
FAKE_EXPORT int nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int len) {
  const int d = Index(device);
  if (d < 0 || uuid == nullptr) return kInvalidArgument;
  if (Lost(d)) return kGpuIsLost;
  Uuid(d, uuid, len);
  return kSuccess;
}
// Utilisation is what the test sets in $FAKE_GPU_UTILIZATION (percent; 0 when
// unset): one figure for every device, or a comma-separated figure per device.
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
FAKE_EXPORT int nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t* utilization) {
  const int d = Index(device);
  if (d < 0 || utilization == nullptr) return kInvalidArgument;
  if (Lost(d)) return kGpuIsLost;
  unsigned int percent = 0;
  if (const char* text = std::getenv("FAKE_GPU_UTILIZATION")) {
    for (int i = 0; i <= d && text != nullptr; ++i) {
      percent = static_cast<unsigned int>(std::strtoul(text, nullptr, 10));
      text = std::strchr(text, ',');
      if (text != nullptr) ++text;
    }
  }
  utilization->gpu = percent;
  utilization->memory = utilization->gpu / 2;
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  const int d = Index(device);
  if (d < 0 || memory == nullptr) return kInvalidArgument;
  if (Lost(d)) return kGpuIsLost;
  fake_gpu::Lock lock;
  memory->total = fake_gpu::Shared()->capacity[d];
  memory->used = fake_gpu::UsedOn(d);
  memory->free = memory->total > memory->used ? memory->total - memory->used : 0;
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (memory == nullptr) return kInvalidArgument;
  nvmlMemory_t m{};
  const int r = nvmlDeviceGetMemoryInfo(device, &m);
  if (r != kSuccess) return r;
  memory->total = m.total;
  memory->reserved = 0;
  memory->free = m.free;
  memory->used = m.used;
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int len) {
  const int d = Index(device);
  if (d < 0 || name == nullptr) return kInvalidArgument;
  std::snprintf(name, len, "Fake GPU %d", d);
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci) {
  const int d = Index(device);
  if (d < 0 || pci == nullptr) return kInvalidArgument;
  std::memset(pci, 0, sizeof(*pci));
  pci->bus = static_cast<unsigned int>(0x17 + d);
  std::snprintf(pci->busId, sizeof(pci->busId), "00000000:%02X:00.0", pci->bus);
  std::snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "0000:%02X:00.0", pci->bus);
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int* node) {
  const int d = Index(device);
  if (d < 0 || node == nullptr) return kInvalidArgument;
  *node = static_cast<unsigned int>(fake_gpu::Shared()->numa[d]);
  return kSuccess;
}
// PCIe: devices with the same FAKE_GPU_SWITCH entry (a list; default: each
// its own) share a switch; else one NUMA node is NODE, two are SYSTEM.
FAKE_EXPORT int nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t a, nvmlDevice_t b, int* level) {
  const int da = Index(a), db = Index(b);
  if (da < 0 || db < 0 || level == nullptr) return kInvalidArgument;
  const auto sa = fake_gpu::EnvListU64("FAKE_GPU_SWITCH", static_cast<std::uint32_t>(da), 1000 + da);
  const auto sb = fake_gpu::EnvListU64("FAKE_GPU_SWITCH", static_cast<std::uint32_t>(db), 1000 + db);
  if (da == db) {
    *level = 0;
  } else if (sa == sb) {
    *level = 10;
  } else {
    *level = fake_gpu::Shared()->numa[da] == fake_gpu::Shared()->numa[db] ? 40 : 50;
  }
  return kSuccess;
}
FAKE_EXPORT int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int* count,
                                                        nvmlProcessInfo_t* infos) {
  const int d = Index(device);
  if (d < 0 || count == nullptr) return kInvalidArgument;
  fake_gpu::Lock lock;
  // FAKE_NVML_HOST_PIDS=1: the node's PIDs, as a real NVML lists them to a
  // process in a container.
  const char* host = std::getenv("FAKE_NVML_HOST_PIDS");
  const bool host_pids = host != nullptr && host[0] == '1';
  unsigned int n = 0;
  for (const auto& p : fake_gpu::Shared()->processes) {
    if (!p.in_use || !fake_gpu::Alive(p.pid) || p.used[d] == 0) continue;
    const std::int32_t pid = host_pids && p.host_pid > 0 ? p.host_pid : p.pid;
    if (infos != nullptr && n < *count) infos[n] = {static_cast<unsigned int>(pid), p.used[d], 0, 0};
    ++n;
  }
  const bool fits = infos != nullptr && n <= *count;
  *count = n;
  return fits ? kSuccess : kInsufficientSize;
}
