// The ledger's compute schedule (see AcquireDevice in ledger.h).
#include <algorithm>
#include <cstdint>

#include "share/ledger.h"

namespace stoker::share {
namespace {

// Rates are in basis points: 1/100 of a percent of a device's time.
constexpr std::uint64_t kWholeDevice = 10'000;

// The most budget a tenant keeps, and its longest turn: its share of a
// period (however fast its budget grows, so that a tenant that starts to
// want the device waits at most that long); for a tenant without a share,
// its rate's part of a period.
std::int64_t Window(std::uint32_t share, std::uint64_t period_ns) {
  return static_cast<std::int64_t>(period_ns / 100 * share);
}
std::int64_t WindowAt(std::uint32_t share, std::uint32_t rate_bp, std::uint64_t period_ns) {
  return share != 0 ? Window(share, period_ns) : static_cast<std::int64_t>(period_ns * rate_bp / kWholeDevice);
}

// A turn with budget: as long as the budget, within the window, and never
// shorter than a twentieth of the period (or the window, if shorter). A
// turn costs a drain at its end; turns of a few microseconds cost more
// than they give, and tenants whose budgets grow between turns at rates
// that add up to the whole device would otherwise drift to them. The time
// past the budget is paid as debt.
std::uint64_t TurnLength(std::int64_t budget_ns, std::int64_t window_ns, std::uint64_t period_ns) {
  const std::int64_t shortest = std::min(window_ns, static_cast<std::int64_t>(period_ns / 20));
  return static_cast<std::uint64_t>(std::max(shortest, std::min(budget_ns, window_ns)));
}

// What `elapsed_ns` earns at `rate_bp`: exact (the product fits 64 bits
// below 2^40 ns, 18 minutes); past that, to within 10 µs.
std::int64_t Earned(std::uint64_t elapsed_ns, std::uint64_t rate_bp) {
  return static_cast<std::int64_t>(elapsed_ns < (std::uint64_t{1} << 40) ? elapsed_ns * rate_bp / kWholeDevice
                                                                         : elapsed_ns / kWholeDevice * rate_bp);
}

// A holder that has not given the device back this long after its time is
// stuck (stopped, or draining a kernel that never ends): others may take
// the device rather than wait forever.
std::uint64_t StuckAfter(std::uint64_t period_ns) {
  return std::max<std::uint64_t>(1'000'000'000, 10 * period_ns);
}

}  // namespace

Ledger::Demand Ledger::DemandOn(std::uint32_t d, const std::uint32_t* need, std::uint32_t also, std::uint64_t now_ns,
                                std::uint64_t period_ns) const {
  Demand demand;
  const std::uint32_t bit = 1u << d;
  const std::uint32_t holder = layout_->devices[d].holder;
  for (std::uint32_t t = 0; t < kMaxTenants; ++t) {
    const LedgerTenant& tenant = layout_->tenants[t];
    if (!tenant.in_use) continue;
    const bool wants = t == also || holder == t + 1 || (need != nullptr && (need[t] & bit)) || (tenant.running & bit) ||
                       (tenant.last_want_ns[d] != 0 && now_ns < tenant.last_want_ns[d] + period_ns);
    if (!wants) continue;
    const std::uint32_t share = ShareOn(t, d);
    if (share == 0)
      ++demand.without_share;
    else
      (tenant.strict ? demand.strict : demand.lending) += share;
  }
  return demand;
}

std::uint32_t Ledger::RateOn(std::uint32_t t, std::uint32_t d, const Demand& demand) const {
  const std::uint64_t share_bp = std::uint64_t{ShareOn(t, d)} * 100;
  const std::uint32_t reserved = demand.strict + demand.lending;
  // The rest of the device, what no share of a tenant that wants it
  // reserves, goes first to the tenants without a share that want it, in
  // equal parts (with none left, they only borrow the device when no one
  // else wants it); else to the lending ones in proportion to their shares:
  // tenants that all want the device never leave it idle because their
  // shares add up to less than 100%. Strict tenants are held to theirs.
  if (share_bp == 0) {
    if (reserved >= 100 || demand.without_share == 0) return 0;
    return static_cast<std::uint32_t>((100 - reserved) * 100 / demand.without_share);
  }
  if (layout_->tenants[t].strict || demand.lending == 0 || demand.without_share != 0 || reserved >= 100)
    return static_cast<std::uint32_t>(share_bp);
  return static_cast<std::uint32_t>(
      std::min<std::uint64_t>(kWholeDevice, share_bp * (100 - demand.strict) / demand.lending));
}

void Ledger::TopUp(std::uint32_t tenant, int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint32_t rate_bp) {
  LedgerTenant& t = layout_->tenants[tenant];
  const std::int64_t window = WindowAt(ShareOn(tenant, static_cast<std::uint32_t>(d)), rate_bp, period_ns);
  if (t.budget_at_ns[d] == 0) {
    t.budget_ns[d] = window;
  } else if (now_ns > t.budget_at_ns[d]) {
    const std::int64_t earned = Earned(now_ns - t.budget_at_ns[d], rate_bp);
    // The window stops its growth but takes nothing away: a window that
    // shrank (a rate that fell as others came to want the device) would
    // otherwise turn the turn under way into debt.
    const std::int64_t grown = t.budget_ns[d] + earned;
    t.budget_ns[d] = grown <= window ? grown : std::max(window, t.budget_ns[d]);
  }
  t.budget_at_ns[d] = now_ns;
}

void Ledger::TopUpSelf(int d, std::uint64_t now_ns, std::uint64_t period_ns) {
  const auto device = static_cast<std::uint32_t>(d);
  TopUp(tenant_, d, now_ns, period_ns, RateOn(tenant_, device, DemandOn(device, nullptr, tenant_, now_ns, period_ns)));
}

namespace {

// A borrowed turn (a tenant out of budget on a device nobody else wants)
// is short: a tenant that starts waiting gets the device within it.
std::uint64_t BorrowedTurn(std::uint64_t period_ns) {
  return std::max<std::uint64_t>(period_ns / 10, 1'000'000);
}

}  // namespace

void Ledger::Schedule(std::uint64_t now_ns, std::uint64_t period_ns) {
  // Each waiting tenant's need: the devices its processes use or wait for.
  // A dead process's wish must not take a turn, but asking the kernel about
  // every waiting slot walks its list of locks each time (O(processes^2)):
  // only the tenant chosen is checked, below; the sweeps free the others.
  std::uint32_t need[kMaxTenants] = {};
  for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
    const LedgerSlot& slot = layout_->slots[s];
    if (slot.in_use && slot.waiting && slot.tenant < kMaxTenants)
      need[slot.tenant] |= slot.waiting | layout_->tenants[slot.tenant].devices_used;
  }
  auto has_live_wish = [&](std::uint32_t t) {
    for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
      const LedgerSlot& slot = layout_->slots[s];
      if (slot.in_use && slot.waiting && slot.tenant == t && (static_cast<int>(s) == slot_ || SlotAlive(s)))
        return true;
    }
    return false;
  };
  auto wanted_by_others = [&](std::uint32_t t, std::uint32_t devices) {
    return WantedByOthers(t, devices, need, now_ns, period_ns);
  };
  // Each device's demand, found once (every candidate is among it).
  Demand demand[kMaxDevices];
  std::uint32_t demand_known = 0;
  auto rate_on = [&](std::uint32_t t, std::uint32_t d) {
    if (!(demand_known & (1u << d))) {
      demand[d] = DemandOn(d, need, kMaxTenants, now_ns, period_ns);
      demand_known |= 1u << d;
    }
    return RateOn(t, d, demand[d]);
  };
  for (;;) {
    int best = -1;
    std::int64_t best_budget = 0;
    bool best_borrows = false;
    for (std::uint32_t t = 0; t < kMaxTenants; ++t) {
      if (need[t] == 0 || !layout_->tenants[t].in_use) continue;
      bool all_free = true, any_to_grant = false;
      std::int64_t budget = INT64_MAX;
      for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
        if (!(need[t] & (1u << d))) continue;
        const std::uint32_t holder = layout_->devices[d].holder;
        if (holder != 0 && holder != t + 1) all_free = false;
        if (holder == 0) any_to_grant = true;
        TopUp(t, static_cast<int>(d), now_ns, period_ns, rate_on(t, d));
        budget = std::min(budget, layout_->tenants[t].budget_ns[d]);
      }
      if (!all_free || !any_to_grant) continue;
      const bool borrows = budget <= 0;
      if (borrows && (layout_->tenants[t].strict || wanted_by_others(t, need[t]))) continue;
      // Budget first; a borrower only when nobody with budget is waiting.
      if (best < 0 || (best_borrows && !borrows) || (best_borrows == borrows && budget > best_budget)) {
        best = static_cast<int>(t);
        best_budget = budget;
        best_borrows = borrows;
      }
    }
    if (best < 0) return;
    const auto t = static_cast<std::uint32_t>(best);
    if (!has_live_wish(t)) {
      need[t] = 0;
      continue;
    }
    for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
      if (!(need[t] & (1u << d)) || layout_->devices[d].holder != 0) continue;
      LedgerDevice& device = layout_->devices[d];
      const std::int64_t window = WindowAt(ShareOn(t, d), rate_on(t, d), period_ns);
      device.hold_started_ns = now_ns;
      device.borrowed = best_borrows ? 1 : 0;
      if (device.running_since_ns != 0 && device.next_tenant == 0) {
        device.next_tenant = t + 1;
        device.next_from_ns = now_ns;
        device.next_until_ns = 0;
      }
      device.hold_until_ns = now_ns + (best_borrows ? BorrowedTurn(period_ns)
                                                    : TurnLength(layout_->tenants[t].budget_ns[d], window, period_ns));
      __atomic_store_n(&device.holder, t + 1, __ATOMIC_RELEASE);
      ++device.turns_granted;
    }
    for (auto& slot : layout_->slots)
      if (slot.in_use && slot.tenant == t) slot.waiting &= ~need[t];
    MarkGranted(t, need[t], now_ns);
    need[t] = 0;
  }
}

bool Ledger::WantedByOthers(std::uint32_t t, std::uint32_t devices, const std::uint32_t* need, std::uint64_t now_ns,
                            std::uint64_t period_ns) const {
  for (std::uint32_t o = 0; o < kMaxTenants; ++o) {
    const LedgerTenant& other = layout_->tenants[o];
    if (o == t || !other.in_use) continue;
    if (need != nullptr && (need[o] & devices)) return true;
    if (other.running & devices) return true;
    for (std::uint32_t d = 0; d < kMaxDevices; ++d)
      if ((devices & (1u << d)) && other.last_want_ns[d] != 0 && now_ns < other.last_want_ns[d] + period_ns)
        return true;
  }
  return false;
}

bool Ledger::ExtendTurn(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_conserving,
                        std::uint64_t* until_ns) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerDevice& device = layout_->devices[d];
  LedgerTenant& me = layout_->tenants[tenant_];
  NoteShareWants(d, now_ns);
  bool extended = false;
  if (device.holder == tenant_ + 1 &&
      !WantedByOthers(tenant_, me.devices_used | (1u << d), nullptr, now_ns, period_ns)) {
    // Nobody else waits: the slots' wishes say the same (none waiting).
    bool waiting = false;
    for (std::uint32_t s = 0; s < kMaxSlots && !waiting; ++s) {
      const LedgerSlot& slot = layout_->slots[s];
      waiting = slot.in_use && slot.tenant != tenant_ && (slot.waiting & (1u << d)) && SlotAlive(s);
    }
    const auto device_index = static_cast<std::uint32_t>(d);
    const std::uint32_t rate =
        RateOn(tenant_, device_index, DemandOn(device_index, nullptr, tenant_, now_ns, period_ns));
    TopUp(tenant_, d, now_ns, period_ns, rate);
    const std::int64_t spent = !device.borrowed && now_ns > device.hold_started_ns
                                   ? static_cast<std::int64_t>(now_ns - device.hold_started_ns)
                                   : 0;
    const bool has_budget = me.budget_ns[d] - spent > 0;
    if (!waiting && (has_budget || work_conserving)) {
      me.budget_ns[d] -= spent;
      device.hold_started_ns = now_ns;
      device.borrowed = has_budget ? 0 : 1;
      device.hold_until_ns =
          now_ns + (has_budget ? TurnLength(me.budget_ns[d], WindowAt(ShareOn(tenant_, device_index), rate, period_ns),
                                            period_ns)
                               : BorrowedTurn(period_ns));
      extended = true;
    }
  }
  if (extended) *until_ns = device.hold_until_ns;
  Unlock();
  return extended;
}

bool Ledger::AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns,
                           bool work_conserving) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& me = layout_->tenants[tenant_];
  me.devices_used |= 1u << d;
  me.strict = work_conserving ? 0 : 1;
  me.last_want_ns[d] = now_ns;
  NoteShareWants(d, now_ns);
  LedgerDevice& device = layout_->devices[d];
  bool held = device.holder == tenant_ + 1;
  if (!held) {
    layout_->slots[slot_].waiting |= 1u << d;
    // Holders that died, or never gave their devices back (stopped, or a
    // kernel that never ends), lose them.
    for (std::uint32_t e = 0; e < kMaxDevices; ++e) {
      LedgerDevice& other = layout_->devices[e];
      if (!(me.devices_used & (1u << e)) || other.holder == 0 || other.holder == tenant_ + 1) continue;
      const std::uint32_t holder = other.holder - 1;
      bool alive = false;
      for (std::uint32_t s = 0; s < kMaxSlots && !alive && holder < kMaxTenants; ++s)
        alive = layout_->slots[s].in_use && layout_->slots[s].tenant == holder && SlotAlive(s);
      if (!alive) {
        __atomic_store_n(&other.holder, 0u, __ATOMIC_RELEASE);
      } else if (now_ns > other.hold_until_ns + StuckAfter(period_ns)) {
        (void)ReclaimDeadSlots();
        if (other.holder != 0) {
          ++other.stuck_takeovers;
          __atomic_store_n(&other.holder, 0u, __ATOMIC_RELEASE);
        }
      }
    }
    SweepWhenDue();  // processes that died waiting, or left work running
    Schedule(now_ns, period_ns);
    held = device.holder == tenant_ + 1;
    if (!held) MarkWaiting(tenant_, 1u << d, now_ns);
  }
  if (held) MarkGranted(tenant_, 1u << d, now_ns);
  if (held) *until_ns = device.hold_until_ns;
  Unlock();
  return held;
}

bool Ledger::HoldsDevice(int d) const {
  return Active() && d >= 0 && __atomic_load_n(&layout_->devices[d].holder, __ATOMIC_ACQUIRE) == tenant_ + 1;
}

bool Ledger::SharesWant(int d, std::uint64_t now_ns, std::uint64_t period_ns) const {
  if (!Active() || d < 0) return false;
  const std::uint64_t wanted = __atomic_load_n(&layout_->devices[d].shares_wanted_ns, __ATOMIC_ACQUIRE);
  return wanted != 0 && now_ns < wanted + period_ns;
}

void Ledger::NoteShareWants(int d, std::uint64_t now_ns) {
  if (ShareOn(tenant_, static_cast<std::uint32_t>(d)) == 0) return;
  LedgerDevice& device = layout_->devices[d];
  if (now_ns > device.shares_wanted_ns) __atomic_store_n(&device.shares_wanted_ns, now_ns, __ATOMIC_RELEASE);
}

std::uint64_t Ledger::HoldUntil(int d) const {
  return d >= 0 ? __atomic_load_n(&layout_->devices[d].hold_until_ns, __ATOMIC_ACQUIRE) : 0;
}

void Ledger::ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_running) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerDevice& device = layout_->devices[d];
  NoteShareWants(d, now_ns);
  if (device.holder == tenant_ + 1) {
    if (device.next_tenant == tenant_ + 1 && device.next_until_ns == 0) device.next_until_ns = now_ns;
    if (work_running) {
      device.running_since_ns = now_ns;
      device.next_tenant = 0;
      layout_->tenants[tenant_].running |= 1u << d;
    }
    LedgerTenant& t = layout_->tenants[tenant_];
    t.last_want_ns[d] = now_ns;
    TopUpSelf(d, now_ns, period_ns);
    if (!device.borrowed && now_ns > device.hold_started_ns)
      t.budget_ns[d] -= static_cast<std::int64_t>(now_ns - device.hold_started_ns);
    __atomic_store_n(&device.holder, 0u, __ATOMIC_RELEASE);
    device.borrowed = 0;
    Schedule(now_ns, period_ns);
  }
  Unlock();
}

void Ledger::MarkWaiting(std::uint32_t t, std::uint32_t mask, std::uint64_t now_ns) {
  LedgerTenant& tenant = layout_->tenants[t];
  if (tenant.waiting_on == 0) tenant.waiting_since_ns = now_ns;
  tenant.waiting_on |= mask;
}

void Ledger::MarkGranted(std::uint32_t t, std::uint32_t mask, std::uint64_t now_ns) {
  LedgerTenant& tenant = layout_->tenants[t];
  if (tenant.waiting_on == 0) return;
  tenant.waiting_on &= ~mask;
  if (tenant.waiting_on == 0 && now_ns > tenant.waiting_since_ns) tenant.waited_ns += now_ns - tenant.waiting_since_ns;
}

std::uint64_t Ledger::WaitedNs(std::uint64_t now_ns) {
  if (!Active() || !Lock()) return 0;
  const LedgerTenant& t = layout_->tenants[tenant_];
  const std::uint64_t waited =
      t.waited_ns + (t.waiting_on != 0 && now_ns > t.waiting_since_ns ? now_ns - t.waiting_since_ns : 0);
  Unlock();
  return waited;
}

void Ledger::ChargeOverrun(int d, std::uint64_t released_ns, std::uint64_t done_ns, std::uint64_t waited_at_release,
                           std::uint64_t period_ns) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerDevice& device = layout_->devices[d];
  LedgerTenant& me = layout_->tenants[tenant_];
  // Queued behind an earlier overrun, it ran only once that one ended.
  std::uint64_t from = released_ns;
  if (device.overrun_released_ns < released_ns && device.overrun_done_ns > from) from = device.overrun_done_ns;
  // Not the time the tenant waited for its own next turn.
  const std::uint64_t waited_now =
      me.waited_ns + (me.waiting_on != 0 && done_ns > me.waiting_since_ns ? done_ns - me.waiting_since_ns : 0);
  const std::uint64_t waited = waited_now > waited_at_release ? waited_now - waited_at_release : 0;
  const std::uint64_t span = done_ns > from ? done_ns - from : 0;
  const std::uint64_t ns = span > waited ? span - waited : 0;
  TopUpSelf(d, done_ns, period_ns);
  me.budget_ns[d] =
      std::max(me.budget_ns[d] - static_cast<std::int64_t>(ns), -static_cast<std::int64_t>(StuckAfter(period_ns)));
  layout_->tenants[tenant_].running &= ~(1u << d);
  // Work that just ended stands for a tenant still at work: its next launch
  // comes a moment later (later still when its CPU is busy), and a tenant
  // out of budget must not borrow the device in that gap.
  me.last_want_ns[d] = std::max(me.last_want_ns[d], done_ns);
  if (done_ns >= device.overrun_done_ns) {
    device.overrun_released_ns = released_ns;
    device.overrun_done_ns = done_ns;
  }
  // The turn after it paid for time this work took: refunded.
  if (device.running_since_ns == released_ns && device.next_tenant != 0 && device.next_tenant != tenant_ + 1) {
    const std::uint64_t until = device.next_until_ns != 0 ? std::min(device.next_until_ns, done_ns) : done_ns;
    const std::uint64_t overlap_from = std::max(device.next_from_ns, from);
    const std::uint32_t next = device.next_tenant - 1;
    if (until > overlap_from && next < kMaxTenants && layout_->tenants[next].in_use)
      layout_->tenants[next].budget_ns[d] += static_cast<std::int64_t>(until - overlap_from);
    device.running_since_ns = 0;
    device.next_tenant = 0;
  }
  Unlock();
}

std::uint64_t Ledger::BudgetWait(int d, std::uint64_t now_ns, std::uint64_t period_ns) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const LedgerTenant& t = layout_->tenants[tenant_];
  const auto device = static_cast<std::uint32_t>(d);
  const std::uint64_t rate = RateOn(tenant_, device, DemandOn(device, nullptr, tenant_, now_ns, period_ns));
  // Without a rate (a tenant without a share on a device the shares fill)
  // only a borrowed turn can come: asking again sooner is pointless.
  std::uint64_t wait = rate == 0 ? BorrowedTurn(period_ns) : 0;
  if (rate > 0 && t.budget_at_ns[d] != 0) {
    const std::uint64_t elapsed = now_ns > t.budget_at_ns[d] ? now_ns - t.budget_at_ns[d] : 0;
    const std::int64_t budget = t.budget_ns[d] + Earned(elapsed, rate);
    if (budget <= 0) wait = (static_cast<std::uint64_t>(-budget) + 1) * kWholeDevice / rate;
  }
  Unlock();
  return wait;
}

}  // namespace stoker::share
