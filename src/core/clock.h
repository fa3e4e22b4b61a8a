// The clock seam: time, sleeping and timed waits go through a Clock so that
// tests of timing logic (backoff, refresh intervals, checkpoint intervals)
// run on a fake clock instead of real sleeps. Clock::Real() is the system's
// steady clock; tests/fake_clock.h advances time by hand.
#pragma once

#include <chrono>

#include "core/mutex.h"

namespace stoker {

class Clock {
 public:
  using Duration = std::chrono::nanoseconds;
  using TimePoint = std::chrono::time_point<std::chrono::steady_clock, Duration>;

  virtual ~Clock() = default;
  // The process-wide real clock (steady_clock); lives until exit.
  static Clock* Real();

  [[nodiscard]] virtual TimePoint Now() const = 0;
  // Seconds since the Unix epoch (wall time), for HTTP dates.
  [[nodiscard]] virtual double UnixSeconds() const = 0;
  virtual void SleepFor(Duration d) = 0;
  // Waits on `cv` until `ready()` or `timeout` of this clock's time has
  // passed; `mu` is held on entry and on return. Returns ready(). A fake
  // clock's waits end when the test advances time past the deadline.
  // (The analysis cannot see that `ready` needs the very `mu` held here;
  // the REQUIRES on the declaration still checks every caller.)
  template <typename Predicate>
  bool WaitFor(CondVar& cv, Mutex& mu, Duration timeout, Predicate ready) REQUIRES(mu) NO_THREAD_SAFETY_ANALYSIS {
    const TimePoint deadline = Now() + timeout;
    while (!ready()) {
      const TimePoint now = Now();
      if (now >= deadline) return false;
      // A real clock waits the whole remaining time; a fake one polls in
      // short real slices so that advancing it is noticed.
      (void)cv.WaitFor(mu, RealSlice(deadline - now), ready);
    }
    return true;
  }

  // Seconds as a Duration.
  static Duration Seconds(double s) { return std::chrono::duration_cast<Duration>(std::chrono::duration<double>(s)); }

 protected:
  // How long one real condition-variable wait of WaitFor may last.
  [[nodiscard]] virtual Duration RealSlice(Duration remaining) const { return remaining; }
};

// Seconds between two time points, as a double.
[[nodiscard]] inline double SecondsBetween(Clock::TimePoint from, Clock::TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace stoker
