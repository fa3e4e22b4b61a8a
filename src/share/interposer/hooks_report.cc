// What a process is told about memory: the quota, never more than the
// device has. total = min(quota, physical); free = what the tenant has left
// of it, never more than the device has free; never an error of our own,
// and NULL pointers are left alone.
#include <algorithm>
#include <cstring>

#include "share/interposer/hook_prologue.h"
#include "share/interposer/nvml_api.h"
#include "share/interposer/real_driver.h"

using stoker::share::Dev;
using stoker::share::Interposer;

namespace {

struct Report {
  std::uint64_t total, free;
};

// The tenant's view of device `dev` given the driver's (physical) view.
Report TenantView(Interposer& ip, const Dev& dev, std::uint64_t physical_total, std::uint64_t physical_free) {
  const std::uint64_t quota = ip.QuotaOf(dev.ordinal);
  if (quota == stoker::share::kNoQuota) return {physical_total, physical_free};
  ip.RefreshPools(dev.ordinal);
  ip.Reconcile(dev.ordinal, /*force=*/false);
  const std::uint64_t total = std::min(quota, physical_total);
  const std::uint64_t used = ip.ledger().TenantCharged(dev.ledger);
  return {total, std::min(total > used ? total - used : 0, physical_free)};
}

}  // namespace

STOKER_HOOK CUresult CUDAAPI cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  STOKER_PROLOGUE(cuMemGetInfo_v2, PFN_cuMemGetInfo_v3020)
  size_t f = 0, t = 0;
  const CUresult r = real(&f, &t);
  Dev dev;
  if (r != CUDA_SUCCESS || !ip.CurrentDevice(&dev)) {
    if (r == CUDA_SUCCESS) {
      if (free_bytes) *free_bytes = f;
      if (total_bytes) *total_bytes = t;
    }
    return r;
  }
  const Report view = TenantView(ip, dev, t, f);
  if (free_bytes) *free_bytes = view.free;
  if (total_bytes) *total_bytes = view.total;
  return CUDA_SUCCESS;
}

STOKER_HOOK CUresult CUDAAPI cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes) {
  STOKER_PROLOGUE(cuMemGetInfo, PFN_cuMemGetInfo_v2000)
  size_t f = 0, t = 0;
  const CUresult r = cuMemGetInfo_v2(&f, &t);
  if (r != CUDA_SUCCESS) return r;
  (void)real;
  if (free_bytes) *free_bytes = static_cast<unsigned int>(std::min<size_t>(f, 0xFFFFFFFFu));
  if (total_bytes) *total_bytes = static_cast<unsigned int>(std::min<size_t>(t, 0xFFFFFFFFu));
  return CUDA_SUCCESS;
}

STOKER_HOOK CUresult CUDAAPI cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  STOKER_PROLOGUE(cuDeviceTotalMem_v2, PFN_cuDeviceTotalMem_v3020)
  size_t physical = 0;
  const CUresult r = real(&physical, device);
  if (r != CUDA_SUCCESS) return r;
  const std::uint64_t quota = ip.QuotaOf(device);
  if (bytes) *bytes = std::min<std::uint64_t>(quota, physical);
  return CUDA_SUCCESS;
}

STOKER_HOOK CUresult CUDAAPI cuDeviceTotalMem(unsigned int* bytes, CUdevice_v1 device) {
  STOKER_PROLOGUE(cuDeviceTotalMem, PFN_cuDeviceTotalMem_v2000)
  (void)real;
  size_t total = 0;
  const CUresult r = cuDeviceTotalMem_v2(&total, device);
  if (r == CUDA_SUCCESS && bytes) *bytes = static_cast<unsigned int>(std::min<size_t>(total, 0xFFFFFFFFu));
  return r;
}

// --- NVML ---

namespace {

// The CUDA ordinal of an NVML device, or -1 (not visible to CUDA here).
int OrdinalOf(Interposer& ip, nvmlDevice_t device) {
  auto get_uuid = reinterpret_cast<stoker::share::NvmlGetUuidFn>(stoker::share::NvmlSymbol("nvmlDeviceGetUUID"));
  char text[stoker::share::kNvmlUuidBytes] = {};
  if (get_uuid == nullptr || get_uuid(device, text, sizeof(text)) != kNvmlSuccess) return -1;
  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" -> 16 bytes.
  std::uint8_t uuid[16];
  int n = 0;
  for (const char* p = text + (std::strncmp(text, "GPU-", 4) == 0 ? 4 : 0); *p && n < 32; ++p) {
    if (*p == '-') continue;
    const char c = *p;
    const int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (v < 0) return -1;
    if (n % 2 == 0)
      uuid[n / 2] = static_cast<std::uint8_t>(v << 4);
    else
      uuid[n / 2] |= static_cast<std::uint8_t>(v);
    ++n;
  }
  return n == 32 ? ip.OrdinalOfUuid(uuid) : -1;
}

// Rewrites NVML's physical view as the tenant's; false when no quota applies.
bool NvmlView(nvmlDevice_t device, std::uint64_t* total, std::uint64_t* free, std::uint64_t* used) {
  Interposer& ip = Interposer::Get();
  if (!ip.ok()) return false;
  const int ordinal = OrdinalOf(ip, device);
  Dev dev;
  if (ordinal < 0 || !ip.DeviceOf(ordinal, &dev)) return false;
  const std::uint64_t quota = ip.QuotaOf(ordinal);
  if (quota == stoker::share::kNoQuota) return false;
  ip.Reconcile(ordinal, /*force=*/false);
  *total = std::min(quota, *total);
  *used = std::min(ip.ledger().TenantCharged(dev.ledger), *total);
  *free = std::min(*total - *used, *free);
  return true;
}

}  // namespace

STOKER_HOOK nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  auto real =
      reinterpret_cast<stoker::share::NvmlGetMemoryInfoFn>(stoker::share::NvmlSymbol("nvmlDeviceGetMemoryInfo"));
  if (real == nullptr) return 3;  // NVML_ERROR_NOT_SUPPORTED: no NVML here
  const nvmlReturn_t r = real(device, memory);
  if (r != kNvmlSuccess || memory == nullptr) return r;
  std::uint64_t total = memory->total, free = memory->free, used = memory->used;
  if (NvmlView(device, &total, &free, &used)) *memory = {total, free, used};
  return r;
}

STOKER_HOOK nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  auto real =
      reinterpret_cast<stoker::share::NvmlGetMemoryInfoV2Fn>(stoker::share::NvmlSymbol("nvmlDeviceGetMemoryInfo_v2"));
  if (real == nullptr) return 3;
  const nvmlReturn_t r = real(device, memory);
  if (r != kNvmlSuccess || memory == nullptr) return r;
  std::uint64_t total = memory->total, free = memory->free, used = memory->used;
  if (NvmlView(device, &total, &free, &used)) {
    memory->total = total;
    memory->free = free;
    memory->used = used;
    memory->reserved = std::min<unsigned long long>(memory->reserved, total - used - free);
  }
  return r;
}
