#include "probe_util.h"

#include <dlfcn.h>
#include <unistd.h>

#include "share/ledger.h"
#include "share/share_config.h"

namespace probe {

int PhysicalOf(const Driver& d, int ordinal) {
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

std::uint64_t FakeProcessUsed(int physical) {
  static UsedFn fn = Control("fakeCudaProcessUsed");
  return fn(physical);
}
std::uint64_t FakeDeviceUsed(int physical) {
  static UsedFn fn = Control("fakeCudaDeviceUsed");
  return fn(physical);
}

std::string LedgerPath() {
  const char* p = std::getenv("STOKER_GPU_LEDGER");
  return p && *p ? p : stoker::share::kDefaultLedgerPath;
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
