// The loader's scheduling rules, without threads: slots and prefetch, reads
// ahead of samples, run-ahead into the next epoch, delivery order.
#include "pipeline/batch_scheduler.h"

#include <algorithm>
#include <deque>
#include <set>

#include <gtest/gtest.h>

namespace stoker::pipeline {
namespace {

std::vector<WorkItem> Drain(BatchScheduler& s) {
  std::vector<WorkItem> out;
  while (auto item = s.PopWork()) out.push_back(*item);
  return out;
}

TEST(BatchScheduler, SchedulesUpToThePrefetchDepthIntoFreeSlots) {
  BatchScheduler s(/*slots=*/4, /*prefetch=*/2, /*batches_per_epoch=*/10);
  s.StartEpoch(0, 0);
  auto a = s.ScheduleNext(), b = s.ScheduleNext();
  ASSERT_TRUE(a && b);
  EXPECT_FALSE(s.ScheduleNext());  // two in flight: the prefetch depth
  EXPECT_EQ(a->batch, 0u);
  EXPECT_EQ(b->batch, 1u);
  EXPECT_NE(a->slot, b->slot);
  EXPECT_EQ(s.NextInFlight(), a->slot);
  s.Delivered();
  EXPECT_EQ(s.next_to_deliver(), 1u);
  auto c = s.ScheduleNext();  // one in flight now; a free slot remains
  ASSERT_TRUE(c);
  EXPECT_EQ(c->batch, 2u);
  EXPECT_NE(c->slot, a->slot);  // a's slot is still held by the consumer
  s.Delivered();
  s.Delivered();
  EXPECT_EQ(s.free_slots(), 1u);
  s.Release(a->slot);
  EXPECT_EQ(s.free_slots(), 2u);
}

TEST(BatchScheduler, AConsumerHoldingOneBatchNeverGetsTheReserve) {
  // Slots 0-2 and the reserve 3, prefetch 2, as the loader schedules: the
  // reserve is withheld right after a delivery only.
  auto run = [](int kept, std::set<std::uint32_t>& used, std::size_t& fewest_in_flight) {
    BatchScheduler s(/*slots=*/4, /*prefetch=*/2, /*batches_per_epoch=*/1000);
    s.StartEpoch(0, 0);
    auto schedule = [&](bool just_delivered) {
      while (auto b = s.ScheduleNext(/*may_use_reserve=*/!just_delivered)) used.insert(b->slot);
    };
    schedule(false);
    std::deque<std::uint32_t> held;  // the loop's batches, oldest first
    for (int step = 0; step < 50; ++step) {
      schedule(false);  // Next(): the loop still holds what it kept
      const auto next = s.NextInFlight();
      ASSERT_TRUE(next);
      s.Delivered();
      schedule(/*just_delivered=*/true);
      held.push_back(*next);
      while (held.size() > static_cast<std::size_t>(kept)) {  // the loop lets go of the oldest
        s.Release(held.front());
        held.pop_front();
        schedule(false);
      }
      // During the step, from the third on (the first time a loop keeps two,
      // the reserve waits for its next call).
      if (step >= 2) fewest_in_flight = std::min(fewest_in_flight, s.in_flight().size());
    }
  };
  std::set<std::uint32_t> used;
  std::size_t fewest = 99;
  run(/*kept=*/1, used, fewest);
  EXPECT_EQ(used, (std::set<std::uint32_t>{0, 1, 2}));  // a loop holding one: the reserve untouched
  EXPECT_EQ(fewest, 2u);
  used.clear();
  fewest = 99;
  run(/*kept=*/2, used, fewest);  // keeping the last two (e.g. the previous batch)
  EXPECT_EQ(used, (std::set<std::uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(fewest, 2u);  // the reserve keeps prefetch 2 in flight through each step
}

TEST(BatchScheduler, ReadsGoAheadOfSamplesButBehindEarlierReads) {
  BatchScheduler s(4, 4, 10);
  s.StartEpoch(0, 0);
  s.QueueSamples(/*slot=*/0, 3);
  s.QueueRead(1);
  s.QueueRead(2);
  const auto items = Drain(s);
  ASSERT_EQ(items.size(), 5u);
  EXPECT_EQ(items[0].kind, ItemKind::kReadBatch);
  EXPECT_EQ(items[0].slot, 1u);
  EXPECT_EQ(items[1].kind, ItemKind::kReadBatch);
  EXPECT_EQ(items[1].slot, 2u);  // behind the earlier read
  for (int i = 2; i < 5; ++i) {
    EXPECT_EQ(items[i].kind, ItemKind::kSample);
    EXPECT_EQ(items[i].index, static_cast<std::uint32_t>(i - 2));
  }
}

TEST(BatchScheduler, RunsAheadAtMostOneEpoch) {
  BatchScheduler s(/*slots=*/8, /*prefetch=*/8, /*batches_per_epoch=*/2);
  s.StartEpoch(5, 0);
  std::vector<ScheduledBatch> got;
  while (auto b = s.ScheduleNext()) got.push_back(*b);
  // Epoch 5's two batches, then epoch 6's two; not epoch 7 before epoch 5 is delivered.
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].epoch, 5u);
  EXPECT_FALSE(got[0].starts_epoch);
  EXPECT_EQ(got[2].epoch, 6u);
  EXPECT_TRUE(got[2].starts_epoch);
  EXPECT_EQ(got[3].batch, 1u);
  s.Delivered();
  s.Delivered();
  EXPECT_TRUE(s.EpochDelivered());
  s.NextEpoch();
  EXPECT_EQ(s.epoch(), 6u);
  auto next = s.ScheduleNext();  // now epoch 7 may start
  ASSERT_TRUE(next);
  EXPECT_EQ(next->epoch, 7u);
  EXPECT_TRUE(next->starts_epoch);
}

TEST(BatchScheduler, ARestartDropsQueuedWorkAndReclaimsSlots) {
  BatchScheduler s(3, 3, 10);
  s.StartEpoch(0, 0);
  while (auto b = s.ScheduleNext()) s.QueueRead(b->slot);
  EXPECT_EQ(s.free_slots(), 0u);
  EXPECT_EQ(s.DropQueued().size(), 3u);
  EXPECT_FALSE(s.HasWork());
  s.ReclaimInFlight();
  EXPECT_EQ(s.free_slots(), 3u);
  s.StartEpoch(2, 7);  // a restore: epoch 2 from batch 7
  auto b = s.ScheduleNext();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, 2u);
  EXPECT_EQ(b->batch, 7u);
  EXPECT_EQ(s.next_to_deliver(), 7u);
}

TEST(BatchScheduler, AnEmptyEpochSchedulesNothing) {
  BatchScheduler s(3, 3, 0);
  s.StartEpoch(0, 0);
  EXPECT_FALSE(s.ScheduleNext());
}

}  // namespace
}  // namespace stoker::pipeline
