#include "probe_util.h"

#include <dlfcn.h>
#include <unistd.h>

#include "share/ledger.h"
#include "share/pinned_limits.h"
#include "share/share_config.h"

namespace probe {

int PhysicalOf(const Driver& d, int ordinal) {
  if (!OnFakeDriver()) {
    // A real device: its NVML index, found by PCI order is not needed here,
    // only for the per-process view; CUDA_VISIBLE_DEVICES is unset in the check.
    return ordinal;
  }
  CUdevice dev = 0;
  CUuuid uuid{};
  Check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
  Check(d.DeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  return (static_cast<unsigned char>(uuid.bytes[0]) >> 4) - 1;
}

namespace {
using UsedFn = unsigned long long (*)(int);
UsedFn Control(const char* name) {
  auto fn = reinterpret_cast<UsedFn>(dlsym(RTLD_DEFAULT, name));
  if (fn == nullptr) Fail(std::string("the fake driver has no ") + name + " (is libcuda.so.1 the fake?)");
  return fn;
}
}  // namespace

// On a real driver (the GPU check): NVML's view of this process, by the
// device's index, which is its physical index.
std::uint64_t NvmlProcessUsed(int physical) {
  using InitFn = int (*)();
  using ByIndexFn = int (*)(unsigned, void**);
  struct Info {
    unsigned pid;
    unsigned long long used;
    unsigned gi, ci;
  };
  using ProcessesFn = int (*)(void*, unsigned*, Info*);
  static void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
  if (lib == nullptr) Fail("neither the fake driver's controls nor NVML are here");
  static auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  static auto by_index = reinterpret_cast<ByIndexFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  static auto processes = reinterpret_cast<ProcessesFn>(dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
  static const bool ready = init && by_index && processes && init() == 0;
  void* device = nullptr;
  Info infos[256];
  unsigned count = 256;
  if (!ready || by_index(static_cast<unsigned>(physical), &device) != 0 || processes(device, &count, infos) != 0)
    Fail("NVML cannot list the device's processes");
  for (unsigned i = 0; i < count; ++i)
    if (infos[i].pid == static_cast<unsigned>(::getpid())) return infos[i].used;
  return 0;
}

bool OnFakeDriver() {
  return dlsym(RTLD_DEFAULT, "fakeCudaProcessUsed") != nullptr;
}

std::uint64_t FakeProcessUsed(int physical) {
  if (!OnFakeDriver()) return NvmlProcessUsed(physical);
  static UsedFn fn = Control("fakeCudaProcessUsed");
  return fn(physical);
}
std::uint64_t FakeDeviceUsed(int physical) {
  static UsedFn fn = Control("fakeCudaDeviceUsed");
  return fn(physical);
}

std::string LedgerPath() {
  stoker::share::ShareConfig config;
  std::string error;
  // What the interposer in this process uses: the pinned limits on top.
  (void)stoker::share::EffectiveShareConfig([](const char* name) { return std::getenv(name); },
                                            stoker::share::kPinnedLimitsPath, &config, &error);
  return config.ledger_path;
}

Charges LedgerCharges(const Driver& d, int ordinal) {
  CUdevice dev = 0;
  CUuuid uuid{};
  Check(d.DeviceGet(&dev, ordinal), "cuDeviceGet");
  Check(d.DeviceGetUuid(&uuid, dev), "cuDeviceGetUuid");
  const std::string want = stoker::share::FormatUuid(reinterpret_cast<const std::uint8_t*>(uuid.bytes));
  stoker::share::LedgerReport report;
  std::string error;
  // One descriptor for every check (the property test reads it after each
  // operation); reopened in a forked child, whose copy is the parent's.
  static stoker::share::Ledger* ledger = nullptr;
  static pid_t opened_by = 0;
  if (ledger == nullptr || opened_by != ::getpid()) {
    ledger = stoker::share::Ledger::Open(LedgerPath(), &error);
    opened_by = ::getpid();
    if (ledger == nullptr) Fail("opening the ledger: " + error);
  }
  if (!ledger->Snapshot(&report, &error)) Fail("reading the ledger: " + error);
  int index = -1;
  for (std::size_t i = 0; i < report.devices.size(); ++i)
    if (report.devices[i].uuid == want) index = static_cast<int>(i);
  Charges c;
  if (index < 0) return c;
  for (const auto& t : report.tenants)
    for (const auto& p : t.processes)
      if (p.pid == ::getpid()) {
        c.process = p.charged[index];
        c.tenant = t.charged[index];
        c.quota = t.quota[index];
        c.oom_refusals = p.oom_refusals;
        c.throttled_ns = p.throttled_ns;
        c.launches = p.launches;
      }
  return c;
}

}  // namespace probe
