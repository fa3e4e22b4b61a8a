// What NVML and the driver say is in use: on a device (DeviceUsed), by this
// process (OwnUsage, NVML's per-process list, matched by the node PID the
// agent recorded where the process runs in a container), and the
// reconciliation of the ledger with the latter.
#include <unistd.h>

#include <cstring>

#include "share/interposer/interposer.h"
#include "share/interposer/nvml_api.h"
#include "share/interposer/real_driver.h"

namespace stoker::share {
namespace {

struct Nvml {
  NvmlGetHandleByUuidFn handle_by_uuid = nullptr;
  NvmlGetMemoryInfoFn memory_info = nullptr;
  NvmlGetProcessesFn processes = nullptr;
  bool ok = false;
};

const Nvml& NvmlCalls() {
  static const Nvml nvml = [] {
    Nvml n;
    auto init = reinterpret_cast<NvmlInitFn>(NvmlSymbol("nvmlInit_v2"));
    if (init == nullptr || init() != kNvmlSuccess) return n;
    n.handle_by_uuid = reinterpret_cast<NvmlGetHandleByUuidFn>(NvmlSymbol("nvmlDeviceGetHandleByUUID"));
    n.memory_info = reinterpret_cast<NvmlGetMemoryInfoFn>(NvmlSymbol("nvmlDeviceGetMemoryInfo"));
    n.processes = reinterpret_cast<NvmlGetProcessesFn>(NvmlSymbol("nvmlDeviceGetComputeRunningProcesses_v3"));
    n.ok = n.handle_by_uuid != nullptr && n.memory_info != nullptr;
    return n;
  }();
  return nvml;
}

bool NvmlDevice(const std::uint8_t uuid[16], nvmlDevice_t* device) {
  const Nvml& n = NvmlCalls();
  return n.ok && n.handle_by_uuid(FormatUuid(uuid).c_str(), device) == kNvmlSuccess;
}

}  // namespace

bool Interposer::DeviceUsed(int ordinal, std::uint64_t* used) {
  std::uint8_t uuid[16];
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    if (ordinal < 0 || ordinal >= static_cast<int>(kMaxOrdinals) || !devices_[ordinal].known) return false;
    std::memcpy(uuid, devices_[ordinal].uuid, 16);
  }
  nvmlDevice_t device = nullptr;
  nvmlMemory_t memory{};
  if (NvmlDevice(uuid, &device) && NvmlCalls().memory_info(device, &memory) == kNvmlSuccess) {
    *used = memory.used;
    return true;
  }
  // Without NVML: the driver's view, from a context on that device.
  CUcontext ctx = nullptr;
  CUdevice current = -1;
  if (calls_.ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr ||
      calls_.ctx_get_device(&current) != CUDA_SUCCESS || current != ordinal)
    return false;
  size_t free_bytes = 0, total = 0;
  if (calls_.mem_get_info(&free_bytes, &total) != CUDA_SUCCESS) return false;
  *used = total - free_bytes;
  return true;
}

bool Interposer::OwnUsage(int ordinal, std::uint64_t* used, bool* listed) {
  const Nvml& n = NvmlCalls();
  if (!n.ok || n.processes == nullptr) return false;
  std::uint8_t uuid[16];
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    if (ordinal < 0 || ordinal >= static_cast<int>(kMaxOrdinals) || !devices_[ordinal].known) return false;
    std::memcpy(uuid, devices_[ordinal].uuid, 16);
  }
  nvmlDevice_t device = nullptr;
  if (!NvmlDevice(uuid, &device)) return false;
  nvmlProcessInfo_t infos[256];
  unsigned int count = 256;
  if (n.processes(device, &count, infos) != kNvmlSuccess) return false;
  // NVML lists the node's PIDs: in a container, the one the node's agent
  // recorded for this process (ledger_host_pids.h).
  const std::int32_t host_pid = ledger_->HostPid();
  const unsigned int pid = static_cast<unsigned int>(host_pid > 0 ? host_pid : ::getpid());
  *listed = false;
  *used = 0;
  for (unsigned int i = 0; i < count; ++i)
    if (infos[i].pid == pid) {
      *listed = true;
      *used = infos[i].usedGpuMemory;
    }
  return true;
}

void Interposer::Reconcile(int ordinal, bool force) {
  if (!force && ordinal >= 0 && ordinal < static_cast<int>(kMaxOrdinals) &&
      MonotonicNs() < __atomic_load_n(&last_reconcile_ns_[ordinal], __ATOMIC_RELAXED) + kReconcileEveryNs)
    return;
  std::uint64_t used = 0;
  bool listed = false;
  if (!OwnUsage(ordinal, &used, &listed)) return;
  int d = -1;
  {
    std::lock_guard<std::mutex> lock(devices_mu_);
    d = devices_[ordinal].ledger;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (!listed) {
    // Not listed (no context there yet, or NVML sees another PID namespace
    // and no agent has said this process's PID there): the measured
    // figures stand, and NVML is asked again a second later.
    __atomic_store_n(&last_reconcile_ns_[ordinal], MonotonicNs() + kNotListedBackoffNs, __ATOMIC_RELAXED);
    return;
  }
  const std::uint64_t target = used > tracked[ordinal] ? used - tracked[ordinal] : 0;
  ledger_->Settle(d, overhead[ordinal], target);
  overhead[ordinal] = target;
  __atomic_store_n(&last_reconcile_ns_[ordinal], MonotonicNs(), __ATOMIC_RELAXED);
}

}  // namespace stoker::share
