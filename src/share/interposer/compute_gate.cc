#include "share/interposer/compute_gate.h"

#include <time.h>

#include <algorithm>
#include <chrono>

namespace stoker::share {
namespace {

// A holder that launched nothing for this long, and whose launched work
// has finished, gives the device back early (its tenant is charged only
// the time it held it). Work still running is not idleness: a process
// waiting on its own kernels (a stream synchronisation, .item()) keeps its
// turn. Before, a turn ended 2 ms into every such wait: the tenants traded
// the device at each synchronisation, and each trade left it idle while
// the next holder woke (two such tenants used 3.4-3.5 s of a fake card's
// 4 s, 2.1-3.2 s through the node agent; now 3.6-3.8 s either way).
constexpr std::uint64_t kIdleReleaseNs = 2'000'000;
constexpr std::uint64_t kPollNs = 200'000;
// How long a turn's end waits for launches between the gate and the driver.
constexpr std::uint64_t kInFlightWaitNs = 20'000'000;

thread_local std::uint64_t tls_launches = 0;
thread_local CUcontext tls_ctx = nullptr;
thread_local Dev tls_dev;
// The stream this thread last noted for a turn, to take the gate's lock
// once per stream and turn, not once per launch.
thread_local CUstream tls_noted_stream = nullptr;
thread_local std::uint64_t tls_noted_until = 0;

// The clock's tick (a few ms) is fine against a period, and it costs a
// third of the precise clock on every launch of a process without a share.
std::uint64_t CoarseNowNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

void CountLaunch(Interposer& ip) {
  if (++tls_launches == 1024) {
    ip.ledger().AddLaunches(tls_launches);
    tls_launches = 0;
  }
}

// Whether work launched into `stream` would be captured into a graph
// instead of running.
bool Capturing(const DriverCalls& d, CUstream stream) {
  if (d.stream_is_capturing == nullptr) return false;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  return d.stream_is_capturing(stream, &status) == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

}  // namespace

ComputeGate& ComputeGate::Get() {
  static ComputeGate* gate = new ComputeGate();
  return *gate;
}

int ComputeGate::Enter(Interposer& ip, CUstream stream, bool per_thread) {
  CountLaunch(ip);
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  if (!ip.scheduled() || period == 0) return -1;
  // The thread's device, cached by context.
  CUcontext ctx = nullptr;
  if (ip.driver().ctx_get_current(&ctx) != CUDA_SUCCESS || ctx == nullptr) return -1;
  if (ctx != tls_ctx) {
    Dev dev;
    if (!ip.CurrentDevice(&dev)) return -1;
    tls_ctx = ctx;
    tls_dev = dev;
    tls_noted_until = 0;
  }
  const Dev dev = tls_dev;
  // Without a share on this card: in its schedule only while a tenant with
  // a share wants it (before, never: its launches went over their turns).
  if (dev.compute_share == 0 && !ip.turns().SharesWant(dev.turns, CoarseNowNs(), period)) return -1;
  // Counted before the turn is looked at (both sequentially consistent):
  // a keeper ending the turn either sees this launch in flight or has
  // already cleared until_ns_, which sends it to the slow path.
  __atomic_add_fetch(&in_flight_[dev.ordinal], 1, __ATOMIC_SEQ_CST);
  const std::uint64_t now = MonotonicNs();
  const std::uint64_t until = __atomic_load_n(&until_ns_[dev.ordinal], __ATOMIC_SEQ_CST);
  if (ip.turns().HoldsDevice(dev.turns) && now < until) {
    __atomic_store_n(&last_launch_ns_[dev.ordinal], now, __ATOMIC_RELAXED);
    if (stream != tls_noted_stream || until != tls_noted_until) NoteStream(dev.ordinal, ctx, stream);
    tls_noted_stream = stream;
    tls_noted_until = until;
    return dev.ordinal;
  }
  Leave(dev.ordinal);
  return EnterSlow(ip, dev, stream, per_thread);
}

// A _ptsz launch on stream 0 goes to the thread's own default stream, which
// the keeper cannot name: it is noted as the legacy default stream (0),
// whose event waits for the per-thread ones.
void ComputeGate::NoteStream(int ordinal, CUcontext ctx, CUstream stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& streams = streams_[ordinal];
  for (const auto& s : streams)
    if (s.ctx == ctx && s.stream == stream) return;
  streams.push_back({ctx, stream});
}

int ComputeGate::EnterSlow(Interposer& ip, const Dev& dev, CUstream stream, bool per_thread) {
  // Captured work does not run now: it needs no turn (and the capture must
  // not wait on one).
  if (Capturing(ip.driver(), per_thread && stream == nullptr ? CU_STREAM_PER_THREAD : stream)) return -1;
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  // (Strict holds a share; without one a process always lends.)
  const bool work_conserving = !ip.config().compute_strict || dev.compute_share == 0;
  const std::uint64_t start = MonotonicNs();
  std::unique_lock<std::mutex> lock(mu_);
  if (!keeper_started_) {
    keeper_started_ = true;
    std::thread([this, &ip] { KeeperLoop(ip); }).detach();
  }
  Turn& turn = turns_[dev.ordinal];
  // Overruns that have finished are paid before asking again (querying in
  // relaxed capture mode: this thread's query must not invalidate another
  // thread's capture).
  if (!pending_.empty()) {
    const auto exchange = ip.driver().exchange_capture_mode;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (exchange != nullptr) (void)exchange(&mode);
    SettlePending(ip);
    if (exchange != nullptr) (void)exchange(&mode);
  }
  for (;;) {
    const std::uint64_t now = MonotonicNs();
    if (!turn.closing) {
      if (turn.held && now < turn.until_ns) break;
      if (!turn.held) {
        std::uint64_t until = 0;
        if (ip.turns().AcquireDevice(dev.turns, now, period, &until, work_conserving)) {
          turn.held = true;
          turn.dev = dev;
          turn.until_ns = until;
          // Its idleness counts from now, not from the last launch of an
          // earlier turn (the keeper, woken below, ended such a turn at once).
          turn.work_seen_ns = 0;
          __atomic_store_n(&last_launch_ns_[dev.ordinal], now, __ATOMIC_RELAXED);
          __atomic_store_n(&until_ns_[dev.ordinal], until, __ATOMIC_RELEASE);
          changed_.notify_all();  // the keeper: a new turn to end
          break;
        }
      }
    }
    // Without a share on the card, a process waits only while a tenant with
    // one wants it (none does any more, or the agent that keeps the mark is
    // away): it then goes ahead without a turn.
    if (dev.compute_share == 0 && !turn.held && !ip.turns().SharesWant(dev.turns, now, period)) return -1;
    // Another tenant's turn, our budget spent, or our turn ending: wait.
    const std::uint64_t budget_wait = turn.held ? 0 : ip.turns().BudgetWait(dev.turns, now, period);
    const std::uint64_t wait = std::clamp<std::uint64_t>(budget_wait, kPollNs, period);
    changed_.wait_for(lock, std::chrono::nanoseconds(wait));
  }
  // In flight and noted while the turn is surely held (the keeper ends it
  // under mu_): its end waits for this launch and marks its stream.
  __atomic_add_fetch(&in_flight_[dev.ordinal], 1, __ATOMIC_SEQ_CST);
  auto& streams = streams_[dev.ordinal];
  if (std::none_of(streams.begin(), streams.end(),
                   [&](const Launched& l) { return l.ctx == tls_ctx && l.stream == stream; }))
    streams.push_back({tls_ctx, stream});
  lock.unlock();
  tls_noted_stream = stream;
  tls_noted_until = __atomic_load_n(&until_ns_[dev.ordinal], __ATOMIC_ACQUIRE);
  const std::uint64_t now = MonotonicNs();
  __atomic_store_n(&last_launch_ns_[dev.ordinal], now, __ATOMIC_RELAXED);
  if (now - start > kPollNs / 4) ip.ledger().AddThrottled(now - start);
  return dev.ordinal;
}

void ComputeGate::KeeperLoop(Interposer& ip) {
  // Its queries must never invalidate another thread's stream capture.
  if (ip.driver().exchange_capture_mode != nullptr) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    (void)ip.driver().exchange_capture_mode(&mode);
  }
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    const std::uint64_t now = MonotonicNs();
    std::uint64_t next = now + 100'000'000;
    for (std::uint32_t o = 0; o < kMaxOrdinals; ++o) {
      Turn& turn = turns_[o];
      if (!turn.held || turn.closing) continue;
      std::uint64_t idle_at =
          std::max(__atomic_load_n(&last_launch_ns_[o], __ATOMIC_RELAXED), turn.work_seen_ns) + kIdleReleaseNs;
      if (now >= idle_at && WorkRunning(ip, static_cast<int>(o), lock)) {
        // Waiting on its own work, not idle: looked at again a while later.
        // (The lock was let go: only this thread ends turns, so it is still held.)
        turn.work_seen_ns = now;
        idle_at = now + kIdleReleaseNs;
      }
      const std::uint64_t end = std::min(turn.until_ns, idle_at);
      if (now >= end && now < idle_at) {
        // Its time is up while it still launches: where nobody else wants
        // the device, the turn goes on (no drain, no gap).
        std::uint64_t until = 0;
        const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
        if (ip.turns().ExtendTurn(turn.dev.turns, now, period,
                                  !ip.config().compute_strict || turn.dev.compute_share == 0, &until)) {
          turn.until_ns = until;
          __atomic_store_n(&until_ns_[o], until, __ATOMIC_RELEASE);
          next = std::min(next, until);
          continue;
        }
      }
      if (now >= end) {
        turn.closing = true;
        __atomic_store_n(&until_ns_[o], 0, __ATOMIC_SEQ_CST);  // launches now take the slow path and wait
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
    if (!pending_.empty()) {
      SettlePending(ip);
      if (!pending_.empty()) next = std::min(next, MonotonicNs() + 1'000'000);
    }
    const std::uint64_t after = MonotonicNs();
    if (next > after) changed_.wait_for(lock, std::chrono::nanoseconds(next - after));
  }
}

std::vector<std::pair<CUcontext, CUevent>> ComputeGate::RecordEvents(Interposer& ip,
                                                                     const std::vector<Launched>& launched) {
  const DriverCalls& d = ip.driver();
  std::vector<std::pair<CUcontext, CUevent>> events;
  for (const Launched& l : launched) {
    if (d.ctx_push == nullptr || d.event_record == nullptr || d.ctx_push(l.ctx) != CUDA_SUCCESS) continue;
    if (!Capturing(d, l.stream)) {
      CUevent event = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = spare_events_.begin(); it != spare_events_.end(); ++it)
          if (it->first == l.ctx) {
            event = it->second;
            spare_events_.erase(it);
            break;
          }
      }
      if (event == nullptr && d.event_create != nullptr) (void)d.event_create(&event, CU_EVENT_DISABLE_TIMING);
      if (event != nullptr && d.event_record(event, l.stream) == CUDA_SUCCESS) {
        events.push_back({l.ctx, event});
      } else if (event != nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        spare_events_.push_back({l.ctx, event});
      }
    }
    CUcontext popped = nullptr;
    if (d.ctx_pop) (void)d.ctx_pop(&popped);
  }
  return events;
}

bool ComputeGate::WorkRunning(Interposer& ip, int ordinal, std::unique_lock<std::mutex>& lock) {
  const std::vector<Launched> launched = streams_[ordinal];
  lock.unlock();
  auto events = RecordEvents(ip, launched);
  const auto query = ip.driver().event_query;
  const bool running = std::any_of(events.begin(), events.end(), [&](const auto& e) {
    return query != nullptr && query(e.second) == CUDA_ERROR_NOT_READY;
  });
  lock.lock();
  spare_events_.insert(spare_events_.end(), events.begin(), events.end());
  return running;
}

void ComputeGate::Release(Interposer& ip, const Dev& dev) {
  // Launches that passed the gate in this turn reach the driver first (a
  // bound keeps a thread stopped in between from holding the device).
  const std::uint64_t in_flight_deadline = MonotonicNs() + kInFlightWaitNs;
  while (__atomic_load_n(&in_flight_[dev.ordinal], __ATOMIC_SEQ_CST) != 0 && MonotonicNs() < in_flight_deadline)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  std::vector<Launched> launched;
  {
    std::lock_guard<std::mutex> lock(mu_);
    launched.swap(streams_[dev.ordinal]);
  }
  const DriverCalls& d = ip.driver();
  // An event after the work each stream queued in this turn.
  Pending pending{dev, 0, 0, RecordEvents(ip, launched)};
  auto give_back = [&](const std::pair<CUcontext, CUevent>& e) {
    std::lock_guard<std::mutex> lock(mu_);
    spare_events_.push_back(e);
  };
  // A short drain: the next holder mostly gets the device to itself.
  auto done = [&](const std::pair<CUcontext, CUevent>& e) {
    const CUresult r = d.event_query != nullptr ? d.event_query(e.second) : CUDA_SUCCESS;
    return r != CUDA_ERROR_NOT_READY;  // an error (a context gone) counts as done
  };
  const std::uint64_t deadline = MonotonicNs() + kDrainNs;
  for (;;) {
    std::erase_if(pending.events, [&](const auto& e) {
      if (!done(e)) return false;
      give_back(e);
      return true;
    });
    if (pending.events.empty() || MonotonicNs() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  const std::uint64_t period = std::uint64_t{ip.config().compute_period_ms} * 1'000'000;
  pending.released_ns = MonotonicNs();
  pending.waited_at_release = ip.turns().WaitedNs(pending.released_ns);
  ip.turns().ReleaseDevice(dev.turns, pending.released_ns, period, !pending.events.empty());
  if (!pending.events.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(pending));
  }
}

// mu_ held.
void ComputeGate::SettlePending(Interposer& ip) {
  const DriverCalls& d = ip.driver();
  const std::uint64_t now = MonotonicNs();
  std::erase_if(pending_, [&](Pending& p) {
    std::erase_if(p.events, [&](const auto& e) {
      if (d.event_query != nullptr && d.event_query(e.second) == CUDA_ERROR_NOT_READY) return false;
      spare_events_.push_back(e);
      return true;
    });
    if (!p.events.empty()) return false;
    // Its work ran on after the turn: the tenant pays for that time too.
    ip.turns().ChargeOverrun(p.dev.turns, p.released_ns, now, p.waited_at_release,
                             std::uint64_t{ip.config().compute_period_ms} * 1'000'000);
    return true;
  });
}

}  // namespace stoker::share
