// A Clock whose time moves only when the test says so. Sleeps advance it at
// once (and are recorded), so code that backs off or waits runs instantly;
// timed waits end when another thread advances time past their deadline.
#pragma once

#include <atomic>
#include <mutex>
#include <vector>

#include "core/clock.h"

namespace stoker::testing {

class FakeClock final : public Clock {
 public:
  TimePoint Now() const override { return TimePoint(Duration(now_ns_.load())); }
  double UnixSeconds() const override { return 1.7e9 + static_cast<double>(now_ns_.load()) * 1e-9; }
  void SleepFor(Duration d) override {
    {
      std::lock_guard lock(mu_);
      sleeps_.push_back(std::chrono::duration<double>(d).count());
    }
    Advance(d);
  }
  void Advance(Duration d) { now_ns_.fetch_add(d.count()); }
  void AdvanceSeconds(double s) { Advance(Seconds(s)); }
  // Every SleepFor so far, in seconds.
  std::vector<double> sleeps() const {
    std::lock_guard lock(mu_);
    return sleeps_;
  }

 protected:
  Duration RealSlice(Duration remaining) const override {
    return std::min<Duration>(remaining, std::chrono::milliseconds(1));
  }

 private:
  std::atomic<std::int64_t> now_ns_{0};
  mutable std::mutex mu_;
  std::vector<double> sleeps_;
};

}  // namespace stoker::testing
