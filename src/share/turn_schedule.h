// The compute schedule as the interposer's gate sees it (compute_gate.h):
// one tenant at a time launches on a device, for its share of the time.
// Two implementations:
//  - Ledger (ledger.h): the schedule's shared-memory file, written by every
//    process directly (the memory ledger itself, a file named by hand, or a
//    node's `turns` made writable by all where no agent runs);
//  - BrokeredTurns (brokered_turns.h): the node agent's schedule, which
//    only the agent writes; a process asks it over a Unix socket and reads
//    whose turn it is from a read-only mapping.
// The contracts are Ledger's (see there); times are CLOCK_MONOTONIC.
//
// Plain C++ and the C library: this runs inside the interposer.
#pragma once

#include <cstdint>
#include <string>

namespace stoker::share {

class TurnSchedule {
 public:
  virtual ~TurnSchedule() = default;

  // The schedule's index for the device `uuid` (added if new); -1 when it
  // cannot be had (the table is full).
  virtual int Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) = 0;
  virtual bool SetComputeShare(int d, std::uint32_t share, std::string* error) = 0;
  virtual bool AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns,
                             bool work_conserving) = 0;
  // The fast path, on every launch: no lock, no system call.
  [[nodiscard]] virtual bool HoldsDevice(int d) const = 0;
  [[nodiscard]] virtual std::uint64_t HoldUntil(int d) const = 0;
  // Whether a tenant with a share on device `d` wanted it within a period
  // of `now_ns`: the processes of a tenant without a share on it then take
  // turns too (else they launch freely). No lock, no system call.
  [[nodiscard]] virtual bool SharesWant(int d, std::uint64_t now_ns, std::uint64_t period_ns) const = 0;
  virtual void ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_running) = 0;
  virtual void ChargeOverrun(int d, std::uint64_t released_ns, std::uint64_t done_ns, std::uint64_t waited_at_release,
                             std::uint64_t period_ns) = 0;
  [[nodiscard]] virtual std::uint64_t WaitedNs(std::uint64_t now_ns) = 0;
  virtual bool ExtendTurn(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_conserving,
                          std::uint64_t* until_ns) = 0;
  [[nodiscard]] virtual std::uint64_t BudgetWait(int d, std::uint64_t now_ns, std::uint64_t period_ns) = 0;
  // Leaves the schedule (normal exit).
  virtual void Unregister() = 0;
  // In a forked child, at once (async-signal-safe), then when it first
  // needs the schedule: the child takes a place of its own.
  virtual void DetachAfterFork() = 0;
  virtual bool ReopenAfterFork(std::string* error) = 0;
};

}  // namespace stoker::share
