// The compute share: with STOKER_GPU_COMPUTE_SHARE set, this process
// launches work on a device only while its tenant holds that device in the
// compute schedule (one tenant at a time, for at most its share of the
// time, on all of its devices at once; see Ledger::AcquireDevice). A keeper
// thread ends the turn when its time is up, or when the process stops
// launching and its work has finished:
//  - it records an event on every stream the turn launched on and waits a
//    short while (kDrainNs) for the queued work, so the next holder mostly
//    has the device to itself;
//  - it then gives the device back whether or not the work is done: a
//    drain never waits on another tenant (a collective whose peer cannot
//    launch before its own turn would otherwise hold every card of both
//    jobs until the stuck timer), and never synchronises a context (which
//    would invalidate another thread's stream capture);
//  - work still running after the turn is charged to the tenant when its
//    events complete, so a long kernel is paid back, not free.
// Launches into a stream being captured do not run: they pass untouched.
// With STOKER_GPU_COMPUTE_STRICT unset, a tenant out of budget still gets
// short turns while no other tenant waits (the device is otherwise idle).
//
// A process without a share on a card takes turns there too, while a tenant
// with a share wants the card (Ledger::SharesWant: within a period), for
// the time the shares leave; otherwise Enter() only counts the launch and
// reads that mark (a thread-local add, a coarse clock read and a load).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include "share/interposer/interposer.h"

namespace stoker::share {

class ComputeGate {
 public:
  static ComputeGate& Get();

  // Call before each launch (kernel, cooperative, graph) on the current
  // context's device, into `stream` (`per_thread`: from a _ptsz entry
  // point, where stream 0 is the thread's own); returns when it may go,
  // with what to pass to Leave() once the launch call has returned.
  [[nodiscard]] int Enter(Interposer& ip, CUstream stream = nullptr, bool per_thread = false);
  // A launch that passed the gate has reached the driver. Until then its
  // turn does not end: a thread preempted between the gate and the driver
  // would otherwise queue its work after the turn was given back, unseen
  // (its tenant then looks idle while it waits on that work, and a tenant
  // out of budget borrows the device again and again).
  void Leave(int counted) {
    if (counted >= 0) __atomic_sub_fetch(&in_flight_[counted], 1, __ATOMIC_SEQ_CST);
  }

  // How long a turn's end waits for its queued work before giving the
  // device back anyway.
  static constexpr std::uint64_t kDrainNs = 5'000'000;

 private:
  ComputeGate() = default;
  [[nodiscard]] int EnterSlow(Interposer& ip, const Dev& dev, CUstream stream, bool per_thread);
  void KeeperLoop(Interposer& ip);
  // Ends the turn on `dev`: marks its streams, drains briefly, gives the
  // device back; what still runs is kept in pending_.
  void Release(Interposer& ip, const Dev& dev);
  // Charges the overrun of pending turns whose work has finished (mu_ held).
  void SettlePending(Interposer& ip);
  void NoteStream(int ordinal, CUcontext ctx, CUstream stream);
  struct Launched {
    CUcontext ctx;
    CUstream stream;
  };
  // An event recorded after the work queued on each of `launched` (streams
  // being captured are skipped), from spare_events_ where one is there.
  // mu_ not held.
  std::vector<std::pair<CUcontext, CUevent>> RecordEvents(Interposer& ip, const std::vector<Launched>& launched);
  // Whether work the turn on `ordinal` launched still runs. `lock` (on mu_)
  // is let go while the driver is asked.
  bool WorkRunning(Interposer& ip, int ordinal, std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable changed_;
  struct Turn {
    bool held = false;
    bool closing = false;
    Dev dev;
    std::uint64_t until_ns = 0;
    std::uint64_t work_seen_ns = 0;  // when its work was last seen running (the keeper's)
  };
  Turn turns_[kMaxOrdinals];
  std::uint64_t last_launch_ns_[kMaxOrdinals] = {};  // atomic access
  std::uint64_t until_ns_[kMaxOrdinals] = {};        // atomic access: the fast path's copy
  std::uint32_t in_flight_[kMaxOrdinals] = {};       // atomic access: launches between Enter and Leave
  bool keeper_started_ = false;

  // The streams each device's turn launched on (mu_ held).
  std::vector<Launched> streams_[kMaxOrdinals];
  // Turns given back before their work finished, and events to reuse (mu_).
  struct Pending {
    Dev dev;
    std::uint64_t released_ns;
    std::uint64_t waited_at_release;  // the tenant's WaitedNs then
    std::vector<std::pair<CUcontext, CUevent>> events;
  };
  std::vector<Pending> pending_;
  std::vector<std::pair<CUcontext, CUevent>> spare_events_;
};

}  // namespace stoker::share
