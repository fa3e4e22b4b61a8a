// Reading the ledger for `stoker gpu ls`.
#include <errno.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "share/ledger.h"

namespace stoker::share {

std::string FormatUuid(const std::uint8_t u[16]) {
  char out[48];
  std::snprintf(out, sizeof(out), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
                u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return out;
}

bool Ledger::Report(const std::string& path, LedgerReport* report, std::string* error) {
  *report = LedgerReport{};
  if (::access(path.c_str(), F_OK) != 0 && errno == ENOENT) return true;  // nothing shared yet
  std::unique_ptr<Ledger> ledger(Open(path, error));
  return ledger != nullptr && ledger->Snapshot(report, error);
}

bool Ledger::Snapshot(LedgerReport* report, std::string* error) {
  *report = LedgerReport{};
  Ledger* ledger = this;
  const std::string& path = path_;
  if (!ledger->Lock()) {
    *error = "the ledger at '" + path + "' is not open in this process";
    return false;
  }
  std::uint32_t before = 0, after = 0;
  for (const auto& s : ledger->layout_->slots) before += s.in_use;
  (void)ledger->ReclaimDeadSlots();
  for (const auto& s : ledger->layout_->slots) after += s.in_use;
  report->reclaimed_slots = before - after;
  report->repairs = ledger->layout_->header.repairs;
  report->fences = __atomic_load_n(&ledger->layout_->header.lock.fences, __ATOMIC_RELAXED);
  const LedgerLayout& l = *ledger->layout_;
  std::uint32_t devices = 0;
  for (std::uint32_t d = 0; d < kMaxDevices; ++d)
    if (l.devices[d].in_use) devices = d + 1;
  for (std::uint32_t d = 0; d < devices; ++d)
    report->devices.push_back({FormatUuid(l.devices[d].uuid), l.devices[d].physical_bytes, l.devices[d].stuck_takeovers,
                               l.devices[d].turns_granted});
  for (std::uint32_t t = 0; t < kMaxTenants; ++t) {
    const LedgerTenant& e = l.tenants[t];
    if (!e.in_use) continue;
    LedgerReport::Tenant tenant;
    tenant.name = e.name;
    tenant.quota.assign(e.quota, e.quota + devices);
    tenant.charged.assign(e.charged, e.charged + devices);
    tenant.compute_share = e.compute_share;
    for (std::uint32_t d = 0; d < devices; ++d)
      tenant.compute_shares.push_back(e.device_share[d] != 0 ? e.device_share[d] : e.compute_share);
    for (const auto& s : l.slots) {
      if (!s.in_use || s.tenant != t) continue;
      LedgerReport::Process p;
      p.pid = s.pid;
      p.charged.assign(s.charged, s.charged + devices);
      p.oom_refusals = s.oom_refusals;
      p.throttled_ns = s.throttled_ns;
      p.launches = s.launches;
      p.started_unix = s.started_unix;
      tenant.processes.push_back(std::move(p));
    }
    report->tenants.push_back(std::move(tenant));
  }
  ledger->Unlock();
  return true;
}

}  // namespace stoker::share
