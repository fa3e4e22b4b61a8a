// The compute schedule through the node agent (turns_broker.h): what a
// process under the interposer uses where the agent keeps the node's turns.
// Calls that change the schedule go to the agent over its socket (a few
// microseconds each, once per turn, not per launch); whether this tenant
// holds a device is read from a read-only mapping of the schedule, so a
// launch inside a turn costs what it does with a shared file.
//
// Where the agent does not answer (not started, restarting, stopped),
// launches under a share wait: they never run unlimited. The process says
// so once on stderr, asks again at most every kReconnectNs, and takes its
// place again (tenant, devices, shares) when the agent is back.
//
// Plain C++ and the C library: this runs inside the interposer.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "share/ledger.h"
#include "share/turn_schedule.h"
#include "share/turns_protocol.h"

namespace stoker::share {

class BrokeredTurns final : public TurnSchedule {
 public:
  struct Options {
    std::string socket_path;  // the agent's
    std::string turns_path;   // the schedule, mapped read-only
    std::string tenant;       // this process's tenant (the agent adds "@uid<uid>")
    std::uint32_t compute_share = 0;
    // Whether the process has a share on any card (else it takes turns only
    // beside tenants with one, and never waits for the agent).
    bool has_share = true;
    // A pinned limits file the device plugin wrote for this tenant: passed
    // to the agent, it vouches for the bare tenant name. Empty: none.
    std::string proof_path;
  };
  // Maps the schedule and asks the agent for a place. Null with `*error`
  // when the schedule cannot be mapped, or when the agent refuses this
  // process (bad name, another release, a share its tenant's other
  // processes disagree with). An agent that does not answer is not an
  // error: launches wait for it.
  static BrokeredTurns* Open(const Options& options, std::string* error);
  ~BrokeredTurns() override;

  int Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) override;
  bool SetComputeShare(int d, std::uint32_t share, std::string* error) override;
  bool AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns,
                     bool work_conserving) override;
  [[nodiscard]] bool HoldsDevice(int d) const override;
  [[nodiscard]] std::uint64_t HoldUntil(int d) const override;
  [[nodiscard]] bool SharesWant(int d, std::uint64_t now_ns, std::uint64_t period_ns) const override;
  void ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_running) override;
  void ChargeOverrun(int d, std::uint64_t released_ns, std::uint64_t done_ns, std::uint64_t waited_at_release,
                     std::uint64_t period_ns) override;
  [[nodiscard]] std::uint64_t WaitedNs(std::uint64_t now_ns) override;
  bool ExtendTurn(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_conserving,
                  std::uint64_t* until_ns) override;
  [[nodiscard]] std::uint64_t BudgetWait(int d, std::uint64_t now_ns, std::uint64_t period_ns) override;
  void Unregister() override;
  void DetachAfterFork() override;
  bool ReopenAfterFork(std::string* error) override;

  static constexpr std::uint64_t kReconnectNs = 100'000'000;

 private:
  explicit BrokeredTurns(Options options) : options_(std::move(options)) {
    for (auto& k : known_) k.remote = k.mark = -1;
  }
  // Connected and known to the agent, connecting if it is time to try.
  // False while the agent does not answer. mu_ held.
  bool Ready(std::string* error);
  // One call; false (and disconnected) when the agent did not answer.
  // mu_ held.
  bool Call(TurnsRequest request, TurnsReply* reply);
  void Disconnect(const char* why);  // mu_ held
  // Device `d` is ours and the agent, connected, knows it. mu_ held.
  [[nodiscard]] bool Served(int d) const;

  // This process's devices, by our own index (the one the gate holds):
  // the agent's index for each while connected (-1: not yet asked).
  struct Known {
    std::uint8_t uuid[16];
    std::uint64_t physical_bytes;
    std::uint32_t share;  // 0: the tenant's
    // Read by HoldsDevice on every launch: atomic.
    std::int32_t remote;
    // Its index in the mapped schedule for SharesWant (atomic): kept while
    // the agent is away (the mark then goes stale, and a process without a
    // share launches freely), and found by UUID in the mapping when the
    // agent never answered (such a process asks nothing until the mark says
    // a tenant with a share wants the card).
    mutable std::int32_t mark;
    // The agent refused our last ask (we wait in its schedule), and when
    // our tenant has budget again by its word (mu_).
    bool waiting;
    std::uint64_t budget_ready_ns;
  };

  Options options_;
  const LedgerLayout* layout_ = nullptr;  // read-only
  std::mutex mu_;
  int fd_ = -1;                           // mu_
  bool refused_ = false;                  // the agent refused this process for good (mu_)
  bool said_waiting_ = false;             // mu_
  std::uint64_t next_attempt_ns_ = 0;     // mu_
  std::uint32_t tenant_index_plus1_ = 0;  // atomic: 0 while not known to the agent
  Known known_[kMaxDevices] = {};
  std::uint32_t known_count_ = 0;  // mu_
};

// Whether the schedule at `turns_path` is the agent's (owned by root and
// writable by nobody else): processes then ask the agent instead of
// writing it.
bool TurnsAreBrokered(const std::string& turns_path);

}  // namespace stoker::share
