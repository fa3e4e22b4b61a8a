#include "pipeline/order_ahead.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace stoker::pipeline {
namespace {

using order::OrderMode;
using order::OrderSpec;
using order::Permutation;
using order::ShardSpan;

const std::vector<ShardSpan> kShards = {{0, 700}, {700, 300}, {1000, 24}};

// A maker that counts its calls, and can be held until released, to see
// which thread made what.
struct CountingMaker {
  std::atomic<int> calls{0};
  std::atomic<bool> hold{false};
  std::atomic<int> stopped{0};
  std::atomic<std::thread::id> last_thread{};

  OrderAhead::Maker Maker() {
    return [this](std::uint64_t epoch, const std::stop_token& stop) -> std::optional<Permutation> {
      ++calls;
      last_thread = std::this_thread::get_id();
      while (hold.load()) {
        if (stop.stop_requested()) {
          ++stopped;
          return std::nullopt;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      return order::EpochOrder(OrderSpec{OrderMode::kShuffle, 5, 8}, epoch, kShards);
    };
  }
};

TEST(OrderAhead, TakesTheOrderMadeAheadOnAnotherThreadAndMakesItOnce) {
  CountingMaker maker;
  OrderAhead ahead(maker.Maker());
  ahead.Start(3);
  EXPECT_TRUE(ahead.Started(3));
  ahead.Start(3);  // already being made: not again
  auto order = ahead.Take(3);
  EXPECT_EQ(maker.calls.load(), 1);
  EXPECT_NE(maker.last_thread.load(), std::this_thread::get_id());
  EXPECT_EQ(*order, order::EpochOrder(OrderSpec{OrderMode::kShuffle, 5, 8}, 3, kShards));
  EXPECT_EQ(ahead.taken_ahead(), 1u);
  EXPECT_FALSE(ahead.Started(3));  // handed over: nothing held ahead
}

TEST(OrderAhead, AnEpochNotStartedIsMadeOnTheCallersThread) {
  CountingMaker maker;
  OrderAhead ahead(maker.Maker());
  auto order = ahead.Take(2);
  EXPECT_EQ(maker.last_thread.load(), std::this_thread::get_id());
  EXPECT_EQ(*order, order::EpochOrder(OrderSpec{OrderMode::kShuffle, 5, 8}, 2, kShards));
  EXPECT_EQ(ahead.taken_ahead(), 0u);
}

TEST(OrderAhead, TakingAnotherEpochStopsTheStaleMakingAndMakesTheOneAsked) {
  CountingMaker maker;
  maker.hold = true;
  OrderAhead ahead(maker.Maker());
  ahead.Start(4);  // set_epoch(9) comes instead
  while (maker.calls.load() == 0) std::this_thread::yield();
  std::thread release([&] {
    while (maker.stopped.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    maker.hold = false;  // the stale making gave up: let the one asked for through
  });
  auto order = ahead.Take(9);
  release.join();
  EXPECT_EQ(maker.stopped.load(), 1);
  EXPECT_EQ(*order, order::EpochOrder(OrderSpec{OrderMode::kShuffle, 5, 8}, 9, kShards));
  EXPECT_EQ(ahead.taken_ahead(), 0u);
}

TEST(OrderAhead, StartingAnotherEpochDropsTheFirst) {
  CountingMaker maker;
  OrderAhead ahead(maker.Maker());
  ahead.Start(1);
  ahead.Start(2);
  EXPECT_FALSE(ahead.Started(1));
  EXPECT_TRUE(ahead.Started(2));
  EXPECT_EQ(*ahead.Take(2), order::EpochOrder(OrderSpec{OrderMode::kShuffle, 5, 8}, 2, kShards));
  EXPECT_EQ(ahead.taken_ahead(), 1u);
}

TEST(OrderAhead, DestroyingItStopsAMakingInFlightPromptly) {
  CountingMaker maker;
  maker.hold = true;
  const auto start = std::chrono::steady_clock::now();
  {
    OrderAhead ahead(maker.Maker());
    ahead.Start(1);
    while (maker.calls.load() == 0) std::this_thread::yield();
  }  // a making that would never end on its own
  EXPECT_EQ(maker.stopped.load(), 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(OrderAhead, AMakingThatFailsIsMadeAgainWhenTaken) {
  int calls = 0;
  OrderAhead ahead([&](std::uint64_t epoch, const std::stop_token&) -> std::optional<Permutation> {
    if (++calls == 1) throw std::bad_alloc();
    return order::EpochOrder(OrderSpec{OrderMode::kSequential, 0, 8}, epoch, kShards);
  });
  ahead.Start(0);
  auto order = ahead.Take(0);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(order->size(), 1024u);
  EXPECT_EQ(ahead.taken_ahead(), 0u);
}

// The library's own maker: the same orders as EpochOrder, and a stop
// request ends a long making (a shuffle of 2^21 positions) early.
// A remote dataset's: the order comes with its shard visits for the rank's
// batches, ready to read without waiting once made; Take hands them over.
TEST(OrderAhead, VisitsAreMadeWithTheOrderAndReadyWithoutWaiting) {
  const OrderSpec spec{OrderMode::kShuffle, 5, 8};
  order::BatchPlan plan;
  plan.num_samples = 1024;
  plan.global_batch = 64;
  plan.world_size = 2;
  plan.rank = 1;
  OrderAhead ahead(spec, kShards, plan);
  EXPECT_EQ(ahead.Ready().visits, nullptr);  // nothing started
  ahead.Start(4);
  OrderAhead::ReadyVisits ready;
  for (int i = 0; i < 10000 && ready.visits == nullptr; ++i) {
    ready = ahead.Ready();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_NE(ready.visits, nullptr);
  EXPECT_EQ(ready.epoch, 4u);
  const Permutation expected = order::EpochOrder(spec, 4, kShards);
  std::vector<std::uint64_t> batch_start;
  EXPECT_EQ(ready.visits->visits, order::ShardVisits(expected, plan, kShards, 0, &batch_start));
  EXPECT_EQ(ready.visits->batch_start, batch_start);
  const std::vector<std::uint32_t> ready_visits = ready.visits->visits;  // valid until Take
  std::optional<order::EpochVisits> visits;
  auto taken = ahead.Take(4, &visits);
  EXPECT_EQ(*taken, expected);
  ASSERT_TRUE(visits.has_value());
  EXPECT_EQ(visits->visits, ready_visits);
  EXPECT_EQ(ahead.Ready().visits, nullptr);  // handed over
  // Made on the caller's thread (not started ahead): no visits.
  auto now = ahead.Take(5, &visits);
  EXPECT_EQ(*now, order::EpochOrder(spec, 5, kShards));
  EXPECT_FALSE(visits.has_value());
  // Without a plan, none are made.
  OrderAhead orders_only(spec, kShards);
  orders_only.Start(1);
  (void)orders_only.Take(1, &visits);
  EXPECT_EQ(orders_only.taken_ahead(), 1u);
  EXPECT_FALSE(visits.has_value());
}

TEST(EpochOrderUnlessStopped, GivesTheEpochOrderOrNothingOnceStopped) {
  const OrderSpec spec{OrderMode::kShardBlockShuffle, 11, 2};
  for (std::uint64_t epoch : {0, 1, 7}) {
    auto order = order::EpochOrderUnlessStopped(spec, epoch, kShards, std::stop_token());
    ASSERT_TRUE(order.has_value());
    EXPECT_EQ(*order, order::EpochOrder(spec, epoch, kShards));
  }
  std::stop_source stop;
  stop.request_stop();
  const std::vector<ShardSpan> big = {{0, std::uint64_t{1} << 21}};
  EXPECT_FALSE(order::EpochOrderUnlessStopped({OrderMode::kShuffle, 1, 8}, 0, big, stop.get_token()).has_value());
  EXPECT_FALSE(
      order::EpochOrderUnlessStopped({OrderMode::kShardBlockShuffle, 1, 8}, 0, big, stop.get_token()).has_value());
}

}  // namespace
}  // namespace stoker::pipeline
