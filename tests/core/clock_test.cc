// The clock seam: a fake clock's sleeps are instant and recorded, and its
// timed waits end when time is advanced, not when real time passes.
#include "core/clock.h"

#include <thread>

#include <gtest/gtest.h>

#include "fake_clock.h"

namespace stoker {
namespace {

TEST(Clock, FakeSleepsAreInstantAndRecorded) {
  testing::FakeClock clock;
  const auto t0 = clock.Now();
  clock.SleepFor(Clock::Seconds(30));
  EXPECT_DOUBLE_EQ(SecondsBetween(t0, clock.Now()), 30.0);
  EXPECT_EQ(clock.sleeps(), std::vector<double>{30.0});
}

TEST(Clock, AFakeTimedWaitEndsWhenTimeIsAdvanced) {
  testing::FakeClock clock;
  Mutex mu;
  CondVar cv;
  bool woke = false;
  std::jthread advancer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    clock.AdvanceSeconds(5);
  });
  MutexLock lock(mu);
  const auto real0 = std::chrono::steady_clock::now();
  const bool ready = clock.WaitFor(cv, mu, Clock::Seconds(4), [&]() REQUIRES(mu) { return woke; });
  EXPECT_FALSE(ready);  // timed out in fake time
  EXPECT_LT(std::chrono::steady_clock::now() - real0, std::chrono::seconds(2));
}

TEST(Clock, TheRealClockWaitsForItsPredicate) {
  Clock* clock = Clock::Real();
  Mutex mu;
  CondVar cv;
  bool woke = false;
  std::jthread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    MutexLock lock(mu);
    woke = true;
    cv.NotifyAll();
  });
  MutexLock lock(mu);
  EXPECT_TRUE(clock->WaitFor(cv, mu, Clock::Seconds(10), [&]() REQUIRES(mu) { return woke; }));
}

}  // namespace
}  // namespace stoker
