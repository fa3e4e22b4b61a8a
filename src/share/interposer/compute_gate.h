// The compute share: with STOKER_GPU_COMPUTE_SHARE set, this process
// launches work on a device only while it holds that device in the
// ledger's schedule (one process at a time, each tenant for at most its
// share of the time; see Ledger::AcquireDevice). A keeper thread gives the
// device back when the turn ends or the process stops launching: it first
// waits for the work already queued (so the next holder has the device to
// itself), and the time held, drain included, is charged to the tenant.
//
// Without a share, Enter() only counts the launch (a thread-local add).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "share/interposer/interposer.h"

namespace stoker::share {

class ComputeGate {
 public:
  static ComputeGate& Get();

  // Call before each launch (kernel, cooperative, graph) on the current
  // context's device; returns when the launch may go.
  void Enter(Interposer& ip);

 private:
  ComputeGate() = default;
  void EnterSlow(Interposer& ip, const Dev& dev);
  void KeeperLoop(Interposer& ip);
  // Waits for the process's queued work on `ordinal`, then gives it back.
  void Release(Interposer& ip, const Dev& dev);

  std::mutex mu_;
  std::condition_variable changed_;
  struct Turn {
    bool held = false;
    bool closing = false;
    Dev dev;
    std::uint64_t until_ns = 0;
  };
  Turn turns_[kMaxOrdinals];
  std::uint64_t last_launch_ns_[kMaxOrdinals] = {};  // atomic access
  std::uint64_t until_ns_[kMaxOrdinals] = {};        // atomic access: the fast path's copy
  bool keeper_started_ = false;
};

}  // namespace stoker::share
