// Which batch buffers a loader touches: a loop holding one batch keeps two
// warm under an automatic depth, batches read ahead wait for a warm one,
// and the consumer's wait or a loop keeping more warms more.
#include "pipeline/buffer_warmth.h"

#include <deque>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "pipeline/batch_scheduler.h"

namespace stoker::pipeline {
namespace {

// The loader's calls in order, without threads: each read batch is read at
// once and decoded in full when it starts; the loop keeps `kept` batches.
struct Simulation {
  BatchScheduler scheduler;
  BufferWarmth warmth;
  std::vector<std::uint32_t> buffer;  // slot -> the buffer it holds now
  std::set<std::uint32_t> decoded_into;
  std::vector<bool> decoded;  // per slot: its batch is decoded
  std::deque<std::uint32_t> held;
  std::optional<std::uint32_t> consumer_waits;
  bool read_at_once = true;  // else reads finish only when the consumer waits for one
  bool newest_first = false;
  std::deque<std::uint32_t> unread;  // scheduled, not read yet, oldest first

  Simulation(std::uint32_t slots, std::uint32_t prefetch, bool warm_only)
      : scheduler(slots, prefetch, 1000), warmth(slots, warm_only), decoded(slots, false) {
    for (std::uint32_t i = 0; i < slots; ++i) buffer.push_back(i);
    scheduler.StartEpoch(0, 0);
  }
  void Start(const BufferWarmth::Start& start) {
    if (start.take_buffer_of) std::swap(buffer[start.slot], buffer[*start.take_buffer_of]);
    decoded_into.insert(buffer[start.slot]);
    decoded[start.slot] = true;
  }
  void Schedule(bool just_delivered) {
    while (auto b = scheduler.ScheduleNext(!just_delivered)) {
      decoded[b->slot] = false;
      warmth.Scheduled(b->slot);
      if (read_at_once) {
        Read(b->slot);
      } else {
        unread.push_back(b->slot);
      }
    }
  }
  void Read(std::uint32_t slot) {
    if (auto start = warmth.ReadDone(slot, scheduler.in_flight(), scheduler.free_list(), consumer_waits == slot))
      Start(*start);
  }
  // Reads that finish late: the oldest unread batch is read now (the
  // newest, with `newest_first`).
  void ReadOne() {
    if (unread.empty()) return;
    const std::uint32_t slot = newest_first ? unread.back() : unread.front();
    newest_first ? unread.pop_back() : unread.pop_front();
    Read(slot);
  }
  void StartWaiting() {
    for (const auto& start : warmth.StartWaiting(scheduler.in_flight(), scheduler.free_list(), consumer_waits))
      Start(start);
  }
  // Next(): the batch it waits for starts if it waited for a buffer.
  std::uint32_t Next() {
    Schedule(false);
    const std::uint32_t s = *scheduler.NextInFlight();
    consumer_waits = s;
    StartWaiting();
    while (!decoded[s] && !unread.empty()) ReadOne();
    EXPECT_TRUE(decoded[s]) << "the consumer would wait for ever";
    consumer_waits.reset();
    scheduler.Delivered();
    Schedule(true);
    return s;
  }
  void Release(std::uint32_t slot) {
    scheduler.Release(slot);
    StartWaiting();
    Schedule(false);
  }
  void Run(int steps, std::size_t kept) {
    Schedule(false);
    for (int i = 0; i < steps; ++i) {
      held.push_back(Next());
      while (held.size() > kept) {
        Release(held.front());
        held.pop_front();
      }
    }
  }
};

TEST(BufferWarmth, ALoopHoldingOneBatchTouchesTwoBuffers) {
  Simulation warm(/*slots=*/4, /*prefetch=*/2, /*warm_only=*/true);
  warm.Run(50, /*kept=*/1);
  EXPECT_EQ(warm.decoded_into.size(), 2u);
  EXPECT_EQ(warm.warmth.touched(), 2u);
  // Every buffer a batch may decode into, without the rule: one in flight
  // beyond, as prefetch 2 fills.
  Simulation eager(4, 2, /*warm_only=*/false);
  eager.Run(50, 1);
  EXPECT_EQ(eager.decoded_into.size(), 3u);
}

TEST(BufferWarmth, BuffersGoInDeliveryOrderWhenReadsFinishLate) {
  // Reads that finish only once the consumer waits: by then the buffer the
  // loop released went to the slot of a later batch, scheduled meanwhile;
  // the earlier batch takes it from that one, not a cold buffer.
  Simulation sim(4, 2, true);
  sim.read_at_once = false;
  sim.Run(50, /*kept=*/1);
  EXPECT_EQ(sim.decoded_into.size(), 2u);
  EXPECT_EQ(sim.warmth.touched(), 2u);
  // Reads that finish newest first: a later batch in a warm slot leaves it
  // to the earlier one.
  Simulation newest(4, 2, true);
  newest.read_at_once = false;
  newest.newest_first = true;
  newest.Run(50, 1);
  EXPECT_EQ(newest.decoded_into.size(), 2u);
}

TEST(BufferWarmth, ReadBatchesWaitForAWarmBufferAndTakeIt) {
  Simulation sim(4, 2, true);
  sim.Schedule(false);  // batches 0 and 1: the first two buffers warm up at once
  EXPECT_EQ(sim.warmth.touched(), 2u);
  const std::uint32_t first = sim.Next();
  // Batch 2 is read ahead into a third slot and waits for a warm buffer.
  const std::uint32_t third = sim.scheduler.in_flight().back();
  EXPECT_TRUE(sim.warmth.Waiting(third));
  EXPECT_FALSE(sim.decoded[third]);
  sim.Release(first);  // the loop lets go of batch 0: batch 2 takes its buffer
  EXPECT_FALSE(sim.warmth.Waiting(third));
  EXPECT_TRUE(sim.decoded[third]);
  EXPECT_EQ(sim.buffer[third], first);
  EXPECT_EQ(sim.warmth.touched(), 2u);
}

TEST(BufferWarmth, ALoopKeepingMoreWarmsAsItWaits) {
  Simulation sim(4, 2, true);
  sim.Run(50, /*kept=*/2);  // the consumer's own wait warms a third
  EXPECT_EQ(sim.decoded_into.size(), 3u);
  Simulation more(5, 3, true);
  more.Run(50, /*kept=*/3);
  EXPECT_EQ(more.decoded_into.size(), 4u);
}

// Four slots, warm buffers only, batches 0 and 1 decoded into slots 0 and 1.
BufferWarmth FirstTwoDecoded() {
  BufferWarmth warmth(4, true);
  const std::vector<std::uint32_t> none;
  const std::deque<std::uint32_t> first{0, 1};
  EXPECT_TRUE(warmth.ReadDone(0, first, none, false));
  EXPECT_TRUE(warmth.ReadDone(1, first, none, false));
  return warmth;
}

TEST(BufferWarmth, AnEmptyBatchTakesNoBufferFromALaterOne) {
  BufferWarmth warmth = FirstTwoDecoded();
  const std::vector<std::uint32_t> none;
  // Batch 2 in (cold) slot 2 is empty; batch 3, in warm slot 0, is read:
  // it decodes at once, leaving nothing to the empty one.
  const std::deque<std::uint32_t> in_flight{1, 2, 0};
  warmth.Scheduled(2);
  warmth.NeedsNoBuffer(2);
  warmth.Scheduled(0);
  const auto start = warmth.ReadDone(0, in_flight, none, false);
  ASSERT_TRUE(start);
  EXPECT_FALSE(start->take_buffer_of);
  EXPECT_EQ(warmth.touched(), 2u);
}

TEST(BufferWarmth, ALaterBatchReadFirstLeavesItsWarmBufferToTheEarlierOne) {
  BufferWarmth warmth = FirstTwoDecoded();
  const std::vector<std::uint32_t> none;
  // Batch 2 (slot 2, cold) and batch 3 (slot 0, warm, freed and taken
  // again); batch 3's read finishes first.
  const std::deque<std::uint32_t> in_flight{1, 2, 0};
  warmth.Scheduled(2);
  warmth.Scheduled(0);
  EXPECT_FALSE(warmth.ReadDone(0, in_flight, none, false));  // left to batch 2
  const auto start = warmth.ReadDone(2, in_flight, none, false);
  ASSERT_TRUE(start);
  EXPECT_EQ(start->take_buffer_of, 0u);
  EXPECT_TRUE(warmth.Waiting(0));
  EXPECT_EQ(warmth.touched(), 2u);
}

TEST(BufferWarmth, DroppingForgetsWaitingBatches) {
  BufferWarmth warmth(4, true);
  const std::vector<std::uint32_t> none;
  const std::deque<std::uint32_t> in_flight{0, 1, 2, 3};
  EXPECT_TRUE(warmth.ReadDone(0, in_flight, none, false));
  EXPECT_TRUE(warmth.ReadDone(1, in_flight, none, false));
  EXPECT_FALSE(warmth.ReadDone(2, in_flight, none, false));
  EXPECT_FALSE(warmth.ReadDone(3, in_flight, none, false));
  EXPECT_TRUE(warmth.Waiting(2));
  EXPECT_EQ(warmth.DropWaiting(), (std::vector<std::uint32_t>{2, 3}));
  EXPECT_FALSE(warmth.Waiting(2));
  EXPECT_TRUE(warmth.DropWaiting().empty());
  // The consumer waiting for a batch starts it in a cold buffer.
  EXPECT_TRUE(warmth.ReadDone(2, in_flight, none, /*consumer_waits=*/true));
  EXPECT_EQ(warmth.touched(), 3u);
  // Without the rule every batch starts at once.
  BufferWarmth eager(4, false);
  for (std::uint32_t s = 0; s < 4; ++s) EXPECT_TRUE(eager.ReadDone(s, in_flight, none, false));
  EXPECT_EQ(eager.touched(), 4u);
}

}  // namespace
}  // namespace stoker::pipeline
