// A ledger's lock, its slots and tenants, and admission (ledger_file.cc
// opens it, ledger_schedule.cc holds the compute schedule).
#include "share/ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

#include "share/ledger_internal.h"

namespace stoker::share {

using internal::LockByte;
using internal::NowUnix;
using internal::SlotByte;
using internal::UnlockByte;

namespace {
std::uint64_t g_lock_bound_ns = kLockBoundNs;
// The acquisition this thread holds (a thread holds one ledger's lock at a
// time; threads of one process share its slot, so the word is per thread).
thread_local std::uint32_t t_held_word = 0;
}  // namespace

void Ledger::SetLockBoundForTest(std::uint64_t ns) {
  g_lock_bound_ns = ns;
}

bool Ledger::OwnerAlive(const void* self, std::uint32_t owner) {
  const auto* ledger = static_cast<const Ledger*>(self);
  if (owner == 0 || owner > kMaxSlots) return false;              // garbage: take it over
  if (static_cast<int>(owner) == ledger->slot_ + 1) return true;  // another of our threads
  return ledger->SlotAlive(owner - 1);
}

bool Ledger::Lock() {
  if (slot_ < 0) return false;
  std::uint32_t held = 0;
  const LockTaken taken = LockLedger(&layout_->header.lock, static_cast<std::uint32_t>(slot_) + 1, g_lock_bound_ns,
                                     &Ledger::OwnerAlive, this, &held);
  t_held_word = held;
  if (taken == LockTaken::kRepair) {
    // The last holder died, or was fenced out, inside its critical section:
    // it may have charged its slot and not its tenant. The slots are the
    // truth (each is written only by its own process).
    (void)ReclaimDeadSlots();
    RecomputeTenants();
    ++layout_->header.repairs;
  }
  return true;
}

void Ledger::Unlock() {
  (void)UnlockLedger(&layout_->header.lock, t_held_word);
}

bool Ledger::ReclaimDeadSlots() {
  bool any = false;
  for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
    LedgerSlot& slot = layout_->slots[s];
    if (!slot.in_use || static_cast<int>(s) == slot_ || SlotAlive(s)) continue;
    if (slot.tenant < kMaxTenants) {
      LedgerTenant& t = layout_->tenants[slot.tenant];
      for (std::uint32_t d = 0; d < kMaxDevices; ++d)
        t.charged[d] = t.charged[d] >= slot.charged[d] ? t.charged[d] - slot.charged[d] : 0;
    }
    std::memset(&slot, 0, sizeof(slot));
    any = true;
  }
  layout_->header.swept_ns = internal::NowMonotonicNs();
  // Tenants without a live process go too.
  bool used[kMaxTenants] = {};
  for (const auto& slot : layout_->slots)
    if (slot.in_use && slot.tenant < kMaxTenants) used[slot.tenant] = true;
  for (std::uint32_t t = 0; t < kMaxTenants; ++t)
    if (layout_->tenants[t].in_use && !used[t] && !(registered_ && tenant_ == t)) {
      std::memset(&layout_->tenants[t], 0, sizeof(LedgerTenant));
      for (auto& device : layout_->devices)  // its turns end with it
        if (device.holder == t + 1) __atomic_store_n(&device.holder, 0u, __ATOMIC_RELEASE);
    }
  return any;
}

void Ledger::SweepWhenDue() {
  const std::uint64_t now_ns = internal::NowMonotonicNs(), swept = layout_->header.swept_ns;
  if (swept == 0 || now_ns > swept + 1'000'000'000 || now_ns < swept) (void)ReclaimDeadSlots();
}

void Ledger::RecomputeTenants() {
  for (auto& t : layout_->tenants) std::memset(t.charged, 0, sizeof(t.charged));
  for (const auto& slot : layout_->slots) {
    if (!slot.in_use || slot.tenant >= kMaxTenants) continue;
    for (std::uint32_t d = 0; d < kMaxDevices; ++d) layout_->tenants[slot.tenant].charged[d] += slot.charged[d];
  }
}

bool Ledger::Register(std::string_view tenant, std::uint32_t compute_share, std::string* error, std::int32_t pid) {
  if (tenant.empty() || tenant.size() >= kTenantNameBytes) {
    *error = "the tenant name must have 1 to 79 characters";
    return false;
  }
  if (registered_) {
    *error = "this process is already registered in the ledger at '" + path_ + "'";
    return false;
  }
  if (!Lock()) {
    *error = "the ledger at '" + path_ + "' was closed in this process (forked child not reopened)";
    return false;
  }
  int t = -1, free_t = -1;
  auto find = [&] {
    t = free_t = -1;
    for (std::uint32_t i = 0; i < kMaxTenants; ++i) {
      LedgerTenant& e = layout_->tenants[i];
      if (e.in_use && std::string_view(e.name) == tenant) t = static_cast<int>(i);
      if (!e.in_use && free_t < 0) free_t = static_cast<int>(i);
    }
  };
  find();
  // Dead processes' slots are swept once a second, and at once when they
  // may be in the way (a tenant left by dead processes with another share,
  // or no room). Swept at every arrival and departure, an agent serving a
  // thousand processes spent 6.5 ms on each.
  const std::uint64_t swept = layout_->header.swept_ns;
  SweepWhenDue();
  if (layout_->header.swept_ns != swept) {
    find();
  } else if ((t >= 0 && layout_->tenants[t].compute_share != compute_share) || (t < 0 && free_t < 0)) {
    if (ReclaimDeadSlots()) find();
  }
  if (t >= 0 && layout_->tenants[t].compute_share != compute_share) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "tenant '%.*s' has a compute share of %u%% (set by another of its processes); this process asks "
                  "for %u%%: all processes of a tenant must agree",
                  static_cast<int>(tenant.size()), tenant.data(), layout_->tenants[t].compute_share, compute_share);
    *error = detail;
    Unlock();
    return false;
  }
  if (t < 0) {
    if (free_t < 0) {
      char detail[160];
      std::snprintf(detail, sizeof(detail), "has no room for another tenant (%u at most)", kMaxTenants);
      *error = "the ledger at '" + path_ + "' " + detail;
      Unlock();
      return false;
    }
    t = free_t;
    LedgerTenant& e = layout_->tenants[t];
    std::memset(&e, 0, sizeof(e));
    std::memcpy(e.name, tenant.data(), tenant.size());
    for (auto& q : e.quota) q = kNoQuota;
    e.compute_share = compute_share;
    e.in_use = 1;
  }
  LedgerSlot& slot = layout_->slots[slot_];
  std::memset(&slot, 0, sizeof(slot));
  slot.pid = pid != 0 ? pid : static_cast<std::int32_t>(::getpid());
  slot.tenant = static_cast<std::uint32_t>(t);
  slot.started_unix = NowUnix();
  __atomic_store_n(&slot.in_use, 1u, __ATOMIC_RELEASE);
  tenant_ = static_cast<std::uint32_t>(t);
  registered_ = true;
  std::memset(tenant_name_, 0, sizeof(tenant_name_));
  std::memcpy(tenant_name_, tenant.data(), tenant.size());
  tenant_share_ = compute_share;
  Unlock();
  return true;
}

void Ledger::Unregister() {
  if (!Active() || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  for (std::uint32_t d = 0; d < kMaxDevices; ++d)
    t.charged[d] = t.charged[d] >= slot.charged[d] ? t.charged[d] - slot.charged[d] : 0;
  std::memset(&slot, 0, sizeof(slot));  // the slot stays claimed (its byte locked) until the ledger closes
  registered_ = false;
  // The tenant goes with its last process (one left by dead processes goes
  // with the next sweep: see Register).
  SweepWhenDue();
  bool others = false;
  for (std::uint32_t s = 0; s < kMaxSlots && !others; ++s)
    others = layout_->slots[s].in_use && layout_->slots[s].tenant == tenant_;
  if (!others) {
    std::memset(&t, 0, sizeof(LedgerTenant));
    for (auto& device : layout_->devices)  // its turns end with it
      if (device.holder == tenant_ + 1) __atomic_store_n(&device.holder, 0u, __ATOMIC_RELEASE);
  }
  Unlock();
}

int Ledger::Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) {
  if (!Lock()) return -1;
  int found = -1, free_d = -1;
  for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
    LedgerDevice& e = layout_->devices[d];
    if (e.in_use && std::memcmp(e.uuid, uuid, 16) == 0) found = static_cast<int>(d);
    if (!e.in_use && free_d < 0) free_d = static_cast<int>(d);
  }
  if (found < 0 && free_d >= 0) {
    LedgerDevice& e = layout_->devices[free_d];
    std::memcpy(e.uuid, uuid, 16);
    e.physical_bytes = physical_bytes;
    e.in_use = 1;
    found = free_d;
  }
  Unlock();
  return found;
}

bool Ledger::SetQuota(int d, std::uint64_t quota, std::string* error) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& t = layout_->tenants[tenant_];
  bool ok = true;
  if (t.quota[d] == kNoQuota) {
    t.quota[d] = quota;
  } else if (t.quota[d] != quota) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "tenant '%s' has a quota of %llu bytes on %s (set by another of its processes); this process asks "
                  "for %llu: all processes of a tenant must agree",
                  t.name, static_cast<unsigned long long>(t.quota[d]), FormatUuid(layout_->devices[d].uuid).c_str(),
                  static_cast<unsigned long long>(quota));
    *error = detail;
    ok = false;
  }
  Unlock();
  return ok;
}

bool Ledger::SetComputeShare(int d, std::uint32_t share, std::string* error) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& t = layout_->tenants[tenant_];
  const std::uint32_t wanted = share != 0 ? share : t.compute_share;
  const std::uint32_t current = t.device_share[d] != 0 ? t.device_share[d] : t.compute_share;
  // The first of its processes to reach the device sets it (as a quota);
  // one that launched there before any did ran at the registered share.
  const bool settled = t.device_share[d] != 0 || (t.devices_used & (1u << d)) != 0;
  const bool ok = current == wanted || !settled;
  if (ok && t.device_share[d] == 0) {
    t.device_share[d] = wanted;
    if (wanted != current) t.budget_at_ns[d] = 0;  // the next top-up starts a window at the new share
  }
  if (!ok) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "tenant '%s' has a compute share of %u%% on %s (set by another of its processes); this process "
                  "asks for %u%%: all processes of a tenant must agree",
                  t.name, current, FormatUuid(layout_->devices[d].uuid).c_str(), wanted);
    *error = detail;
  }
  Unlock();
  return ok;
}

std::uint32_t Ledger::ShareOn(std::uint32_t t, std::uint32_t d) const {
  const LedgerTenant& tenant = layout_->tenants[t];
  return tenant.device_share[d] != 0 ? tenant.device_share[d] : tenant.compute_share;
}

bool Ledger::Charge(int d, std::uint64_t bytes, bool count_refusal) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& t = layout_->tenants[tenant_];
  LedgerSlot& slot = layout_->slots[slot_];
  auto fits = [&] { return t.quota[d] == kNoQuota || (bytes <= t.quota[d] && t.charged[d] <= t.quota[d] - bytes); };
  bool ok = fits();
  if (!ok && ReclaimDeadSlots()) ok = fits();  // a dead process's memory is the driver's again
  if (ok) {
    slot.charged[d] += bytes;
    t.charged[d] += bytes;
  } else if (count_refusal) {
    ++slot.oom_refusals;
  }
  Unlock();
  return ok;
}

void Ledger::ForceCharge(int d, std::uint64_t bytes) {
  if (!Active() || d < 0 || !Lock()) return;
  layout_->slots[slot_].charged[d] += bytes;
  layout_->tenants[tenant_].charged[d] += bytes;
  Unlock();
}

void Ledger::Uncharge(int d, std::uint64_t bytes) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  const std::uint64_t b = bytes <= slot.charged[d] ? bytes : slot.charged[d];
  slot.charged[d] -= b;
  t.charged[d] = t.charged[d] >= b ? t.charged[d] - b : 0;
  Unlock();
}

void Ledger::Settle(int d, std::uint64_t reserved, std::uint64_t actual) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  if (actual >= reserved) {
    slot.charged[d] += actual - reserved;
    t.charged[d] += actual - reserved;
  } else {
    const std::uint64_t b = std::min(reserved - actual, slot.charged[d]);
    slot.charged[d] -= b;
    t.charged[d] = t.charged[d] >= b ? t.charged[d] - b : 0;
  }
  Unlock();
}

std::uint64_t Ledger::ContextBytes(int d) const {
  return layout_ != nullptr && d >= 0 ? __atomic_load_n(&layout_->devices[d].context_bytes, __ATOMIC_RELAXED) : 0;
}

void Ledger::LearnContextBytes(int d, std::uint64_t bytes) {
  if (layout_ != nullptr && d >= 0 && bytes > 0)
    __atomic_store_n(&layout_->devices[d].context_bytes, bytes, __ATOMIC_RELAXED);
}

namespace {

std::uint64_t CodeKeyOn(std::uint64_t key, int d) {
  const std::uint64_t k = key ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(d + 1));
  return k == 0 ? 1 : k;
}

}  // namespace

std::uint64_t Ledger::CodeBytes(int d, std::uint64_t key) {
  if (key == 0 || d < 0 || !Active() || !Lock()) return 0;
  const std::uint64_t k = CodeKeyOn(key, d);
  std::uint64_t bytes = 0;
  for (auto& e : layout_->code_sizes)
    if (e.key == k) {
      bytes = e.bytes;
      e.used_unix = NowUnix();
      break;
    }
  Unlock();
  return bytes;
}

void Ledger::LearnCodeBytes(int d, std::uint64_t key, std::uint64_t bytes) {
  if (key == 0 || d < 0 || bytes == 0 || !Active() || !Lock()) return;
  const std::uint64_t k = CodeKeyOn(key, d);
  LedgerCodeSize* slot = nullptr;
  for (auto& e : layout_->code_sizes) {
    if (e.key == k) {
      slot = &e;
      break;
    }
    if (slot == nullptr || (slot->key != 0 && (e.key == 0 || e.used_unix < slot->used_unix))) slot = &e;
  }
  slot->key = k;
  slot->bytes = bytes;
  slot->used_unix = NowUnix();
  Unlock();
}

std::uint64_t Ledger::TenantCharged(int d) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const std::uint64_t v = layout_->tenants[tenant_].charged[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::DeviceCharged(int d) {
  if (d < 0 || !Lock()) return 0;
  std::uint64_t v = 0;
  for (const auto& t : layout_->tenants)
    if (t.in_use) v += t.charged[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::Quota(int d) {
  if (!Active() || d < 0 || !Lock()) return kNoQuota;
  const std::uint64_t v = layout_->tenants[tenant_].quota[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::SlotCharged(int d) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const std::uint64_t v = layout_->slots[slot_].charged[d];
  Unlock();
  return v;
}

std::int32_t Ledger::HostPid() const {
  return Active() ? __atomic_load_n(&layout_->slots[slot_].host_pid, __ATOMIC_RELAXED) : 0;
}

bool Ledger::RecordHostPid(std::int32_t ns_pid, std::int32_t host_pid) {
  if (slot_ < 0 || !Lock()) return false;
  int found = -1, matches = 0;
  for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
    const LedgerSlot& slot = layout_->slots[s];
    if (static_cast<int>(s) == slot_ || !slot.in_use || slot.pid != ns_pid || !SlotAlive(s)) continue;
    found = static_cast<int>(s);
    ++matches;
  }
  if (matches == 1) __atomic_store_n(&layout_->slots[found].host_pid, host_pid, __ATOMIC_RELAXED);
  Unlock();
  return matches == 1;
}

void Ledger::AddThrottled(std::uint64_t ns) {
  if (Active()) __atomic_fetch_add(&layout_->slots[slot_].throttled_ns, ns, __ATOMIC_RELAXED);
}
void Ledger::AddLaunches(std::uint64_t n) {
  if (Active()) __atomic_fetch_add(&layout_->slots[slot_].launches, n, __ATOMIC_RELAXED);
}
std::uint32_t Ledger::compute_share() {
  return Active() ? layout_->tenants[tenant_].compute_share : 0;
}

}  // namespace stoker::share
