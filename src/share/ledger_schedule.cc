// The ledger's compute schedule (see AcquireDevice in ledger.h).
#include <algorithm>

#include "share/ledger.h"

namespace stoker::share {
namespace {

std::int64_t Window(std::uint32_t share, std::uint64_t period_ns) {
  return static_cast<std::int64_t>(period_ns / 100 * share);
}

// A holder that has not given the device back this long after its time is
// stuck (stopped, or draining a kernel that never ends): others may take
// the device rather than wait forever.
std::uint64_t StuckAfter(std::uint64_t period_ns) {
  return std::max<std::uint64_t>(1'000'000'000, 10 * period_ns);
}

}  // namespace

void Ledger::TopUp(std::uint32_t tenant, int d, std::uint64_t now_ns, std::uint64_t period_ns) {
  LedgerTenant& t = layout_->tenants[tenant];
  const std::int64_t window = Window(t.compute_share, period_ns);
  if (t.budget_at_ns[d] == 0) {
    t.budget_ns[d] = window;
  } else if (now_ns > t.budget_at_ns[d]) {
    const auto earned = static_cast<std::int64_t>((now_ns - t.budget_at_ns[d]) / 100 * t.compute_share);
    t.budget_ns[d] = std::min(window, t.budget_ns[d] + earned);
  }
  t.budget_at_ns[d] = now_ns;
}

void Ledger::HandOver(int d, std::uint64_t now_ns, std::uint64_t period_ns) {
  LedgerDevice& device = layout_->devices[d];
  int best = -1;
  std::int64_t best_budget = 0;
  for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
    const LedgerSlot& slot = layout_->slots[s];
    if (!slot.in_use || !(slot.waiting & (1u << d)) || slot.tenant >= kMaxTenants) continue;
    TopUp(slot.tenant, d, now_ns, period_ns);
    const std::int64_t budget = layout_->tenants[slot.tenant].budget_ns[d];
    if (budget > best_budget) {
      best = static_cast<int>(s);
      best_budget = budget;
    }
  }
  if (best < 0) {
    __atomic_store_n(&device.holder, 0u, __ATOMIC_RELEASE);
    return;
  }
  LedgerSlot& next = layout_->slots[best];
  next.waiting &= ~(1u << d);
  device.hold_started_ns = now_ns;
  device.hold_until_ns = now_ns + static_cast<std::uint64_t>(std::min(
                                      best_budget, Window(layout_->tenants[next.tenant].compute_share, period_ns)));
  __atomic_store_n(&device.holder, static_cast<std::uint32_t>(best) + 1, __ATOMIC_RELEASE);
}

bool Ledger::AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerDevice& device = layout_->devices[d];
  const std::uint32_t me = static_cast<std::uint32_t>(slot_) + 1;
  bool held = device.holder == me;
  if (!held) {
    bool free = device.holder == 0;
    if (!free && (!SlotAlive(device.holder - 1) || now_ns > device.hold_until_ns + StuckAfter(period_ns))) {
      (void)ReclaimDeadSlots();
      free = true;
    }
    if (free) {
      // Whoever waits with the most budget goes first; this process too.
      layout_->slots[slot_].waiting |= 1u << d;
      HandOver(d, now_ns, period_ns);
      held = device.holder == me;
    } else {
      layout_->slots[slot_].waiting |= 1u << d;
    }
  }
  if (held) *until_ns = device.hold_until_ns;
  Unlock();
  return held;
}

bool Ledger::HoldsDevice(int d) const {
  return Active() && d >= 0 &&
         __atomic_load_n(&layout_->devices[d].holder, __ATOMIC_ACQUIRE) == static_cast<std::uint32_t>(slot_) + 1;
}

std::uint64_t Ledger::HoldUntil(int d) const {
  return d >= 0 ? __atomic_load_n(&layout_->devices[d].hold_until_ns, __ATOMIC_ACQUIRE) : 0;
}

void Ledger::ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerDevice& device = layout_->devices[d];
  if (device.holder == static_cast<std::uint32_t>(slot_) + 1) {
    LedgerTenant& t = layout_->tenants[tenant_];
    TopUp(tenant_, d, now_ns, period_ns);
    if (now_ns > device.hold_started_ns) t.budget_ns[d] -= static_cast<std::int64_t>(now_ns - device.hold_started_ns);
    HandOver(d, now_ns, period_ns);
  }
  Unlock();
}

std::uint64_t Ledger::BudgetWait(int d, std::uint64_t now_ns) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const LedgerTenant& t = layout_->tenants[tenant_];
  std::uint64_t wait = 0;
  if (t.compute_share > 0 && t.budget_at_ns[d] != 0) {
    const std::int64_t elapsed = now_ns > t.budget_at_ns[d] ? static_cast<std::int64_t>(now_ns - t.budget_at_ns[d]) : 0;
    const std::int64_t budget = t.budget_ns[d] + elapsed / 100 * t.compute_share;
    if (budget <= 0) wait = static_cast<std::uint64_t>((-budget + 1) * 100 / t.compute_share);
  }
  Unlock();
  return wait;
}

}  // namespace stoker::share
