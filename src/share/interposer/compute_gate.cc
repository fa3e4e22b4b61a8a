#include "share/interposer/compute_gate.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace stoker::share {
namespace {

// A holder that launched nothing for this long gives the device back early
// (its tenant is charged only the time it held it).
constexpr std::uint64_t kIdleReleaseNs = 2'000'000;
constexpr std::uint64_t kPollNs = 200'000;

thread_local std::uint64_t tls_launches = 0;
thread_local CUcontext tls_ctx = nullptr;
thread_local Dev tls_dev;

void CountLaunch(Interposer& ip) {
  if (++tls_launches == 1024) {
    ip.ledger().AddLaunches(tls_launches);
    tls_launches = 0;
  }
}

}  // namespace

ComputeGate& ComputeGate::Get() {
  static ComputeGate* gate = new ComputeGate();
  return *gate;
}

void ComputeGate::Enter(Interposer& ip) {
  CountLaunch(ip);
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  if (ip.config().compute_share == 0 || ip.config().compute_by_mps || period == 0) return;
  // The thread's device, cached by context.
  CUcontext ctx = nullptr;
  if (ip.driver().ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return;
  if (ctx != tls_ctx) {
    Dev dev;
    if (!ip.CurrentDevice(&dev)) return;
    tls_ctx = ctx;
    tls_dev = dev;
  }
  const Dev dev = tls_dev;
  const std::uint64_t now = MonotonicNs();
  if (ip.turns().HoldsDevice(dev.turns) && now < __atomic_load_n(&until_ns_[dev.ordinal], __ATOMIC_ACQUIRE)) {
    __atomic_store_n(&last_launch_ns_[dev.ordinal], now, __ATOMIC_RELAXED);
    return;
  }
  EnterSlow(ip, dev);
}

void ComputeGate::EnterSlow(Interposer& ip, const Dev& dev) {
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  const std::uint64_t start = MonotonicNs();
  std::unique_lock<std::mutex> lock(mu_);
  if (!keeper_started_) {
    keeper_started_ = true;
    std::thread([this, &ip] { KeeperLoop(ip); }).detach();
  }
  Turn& turn = turns_[dev.ordinal];
  for (;;) {
    const std::uint64_t now = MonotonicNs();
    if (!turn.closing) {
      if (turn.held && now < turn.until_ns) break;
      if (!turn.held) {
        std::uint64_t until = 0;
        if (ip.turns().AcquireDevice(dev.turns, now, period, &until)) {
          turn.held = true;
          turn.dev = dev;
          turn.until_ns = until;
          __atomic_store_n(&until_ns_[dev.ordinal], until, __ATOMIC_RELEASE);
          changed_.notify_all();  // the keeper: a new turn to end
          break;
        }
      }
    }
    // Another process's turn, our budget spent, or our turn ending: wait.
    const std::uint64_t budget_wait = turn.held ? 0 : ip.turns().BudgetWait(dev.turns, now);
    const std::uint64_t wait = std::clamp<std::uint64_t>(budget_wait, kPollNs, period);
    changed_.wait_for(lock, std::chrono::nanoseconds(wait));
  }
  const std::uint64_t now = MonotonicNs();
  __atomic_store_n(&last_launch_ns_[dev.ordinal], now, __ATOMIC_RELAXED);
  if (now - start > kPollNs / 4) ip.ledger().AddThrottled(now - start);
}

void ComputeGate::KeeperLoop(Interposer& ip) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const std::uint64_t now = MonotonicNs();
    std::uint64_t next = now + 100'000'000;
    for (std::uint32_t o = 0; o < kMaxOrdinals; ++o) {
      Turn& turn = turns_[o];
      if (!turn.held || turn.closing) continue;
      const std::uint64_t idle_at = __atomic_load_n(&last_launch_ns_[o], __ATOMIC_RELAXED) + kIdleReleaseNs;
      const std::uint64_t end = std::min(turn.until_ns, idle_at);
      if (now >= end) {
        turn.closing = true;
        __atomic_store_n(&until_ns_[o], 0, __ATOMIC_RELEASE);  // launches now take the slow path and wait
        const Dev dev = turn.dev;
        lock.unlock();
        Release(ip, dev);
        lock.lock();
        turn.held = false;
        turn.closing = false;
        __atomic_store_n(&until_ns_[o], 0, __ATOMIC_RELEASE);
        changed_.notify_all();
        next = now;  // look again at once
        break;
      }
      next = std::min(next, end);
    }
    const std::uint64_t after = MonotonicNs();
    if (next > after) changed_.wait_for(lock, std::chrono::nanoseconds(next - after));
  }
}

void ComputeGate::Release(Interposer& ip, const Dev& dev) {
  // The process's contexts on that device: its queued work finishes inside
  // its own turn.
  std::vector<CUcontext> contexts;
  {
    std::lock_guard<std::mutex> lock(ip.mu);
    for (const auto& [ctx, c] : ip.contexts)
      if (c.dev.ordinal == dev.ordinal) contexts.push_back(ctx);
  }
  const DriverCalls& d = ip.driver();
  for (CUcontext ctx : contexts) {
    if (d.ctx_push == nullptr || d.ctx_push(ctx) != CUDA_SUCCESS) continue;
    if (d.ctx_synchronize) (void)d.ctx_synchronize();
    CUcontext popped = nullptr;
    if (d.ctx_pop) (void)d.ctx_pop(&popped);
  }
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  ip.turns().ReleaseDevice(dev.turns, MonotonicNs(), period);
}

}  // namespace stoker::share
