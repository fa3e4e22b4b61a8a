#include "core/clock.h"

#include <thread>

namespace stoker {
namespace {

class RealClock final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::time_point_cast<Duration>(std::chrono::steady_clock::now()); }
  double UnixSeconds() const override {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  }
  void SleepFor(Duration d) override { std::this_thread::sleep_for(d); }
};

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();  // never destroyed: used until exit
  return clock;
}

}  // namespace stoker
