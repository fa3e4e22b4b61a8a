// Which batch buffers a loader touches: a loop holding one batch keeps two
// warm under an automatic depth, batches read ahead wait for a warm one,
// and the consumer's wait or a loop keeping more warms more.
#include "pipeline/buffer_warmth.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/rng.h"
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
  Rng* random_reads = nullptr;       // else reads finish in order (or newest first)
  std::deque<std::uint32_t> unread;  // scheduled, not read yet, oldest first

  Simulation(std::uint32_t slots, std::uint32_t prefetch, bool warm_only)
      : scheduler(slots, prefetch, 1000), warmth(slots, warm_only), decoded(slots, false) {
    for (std::uint32_t i = 0; i < slots; ++i) buffer.push_back(i);
    scheduler.StartEpoch(0, 0);
  }
  void Start(const BufferWarmth::Start& start) {
    if (start.take_buffer_of) {
      // Never a buffer a batch is in: one held by the loop or being decoded into.
      const std::uint32_t from = *start.take_buffer_of;
      EXPECT_TRUE(std::find(held.begin(), held.end(), from) == held.end()) << "took a held batch's buffer";
      const auto& in_flight = scheduler.in_flight();
      EXPECT_FALSE(decoded[from] && std::find(in_flight.begin(), in_flight.end(), from) != in_flight.end())
          << "took a decoding batch's buffer";
      std::swap(buffer[start.slot], buffer[from]);
    }
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
    for (const auto& start : warmth.ReadDone(slot, scheduler.in_flight(), scheduler.free_list(), consumer_waits))
      Start(start);
  }
  // Reads that finish late: the oldest unread batch is read now (the
  // newest, with `newest_first`).
  void ReadOne() {
    if (unread.empty()) return;
    if (random_reads != nullptr) {
      const auto at = unread.begin() + static_cast<std::ptrdiff_t>(random_reads->Below(unread.size()));
      const std::uint32_t slot = *at;
      unread.erase(at);
      Read(slot);
      return;
    }
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
        const std::uint32_t oldest = held.front();
        held.pop_front();
        Release(oldest);
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

TEST(BufferWarmth, ReadsInAnyOrderAndLoopsKeepingZeroToTwoNeverStallNorStealNorOverTouch) {
  // Random read order and a loop that keeps 0, 1 or 2 batches, changing at
  // random: the batch the consumer waits for always gets a buffer, no
  // buffer in use changes hands, and no more than held + 1 are touched.
  for (std::uint64_t seed = 0; seed < 200; ++seed) {
    SCOPED_TRACE(seed);
    Rng rng(seed, 0);
    Simulation sim(5, 3, true);
    sim.read_at_once = false;
    sim.random_reads = &rng;
    sim.Schedule(false);
    std::size_t most_kept = 0;
    std::map<std::uint32_t, std::uint32_t> held_buffer;  // the loop's batches: slot -> buffer at delivery
    for (int step = 0; step < 300; ++step) {
      for (std::uint64_t reads = rng.Below(3); reads > 0; --reads) sim.ReadOne();
      most_kept = std::max(most_kept, sim.held.size());  // held while it asks
      const std::uint32_t s = sim.Next();
      held_buffer[s] = sim.buffer[s];
      sim.held.push_back(s);
      const auto kept = static_cast<std::size_t>(rng.Below(3));
      while (sim.held.size() > kept) {
        const std::uint32_t oldest = sim.held.front();
        sim.held.pop_front();
        held_buffer.erase(oldest);
        sim.Release(oldest);
      }
      for (std::uint32_t h : sim.held) EXPECT_EQ(sim.buffer[h], held_buffer[h]) << "a held batch's buffer moved";
      ASSERT_FALSE(::testing::Test::HasFailure());
    }
    EXPECT_LE(sim.decoded_into.size(), std::max<std::size_t>(BufferWarmth::kWorkingSet, most_kept + 1));
  }
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

// The slots of `starts`, in order.
std::vector<std::uint32_t> Slots(const std::vector<BufferWarmth::Start>& starts) {
  std::vector<std::uint32_t> slots;
  for (const auto& start : starts) slots.push_back(start.slot);
  return slots;
}

// Four slots, warm buffers only, batches 0 and 1 decoded into slots 0 and 1.
BufferWarmth FirstTwoDecoded() {
  BufferWarmth warmth(4, true);
  const std::vector<std::uint32_t> none;
  const std::deque<std::uint32_t> first{0, 1};
  EXPECT_EQ(Slots(warmth.ReadDone(0, first, none, std::nullopt)), (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(Slots(warmth.ReadDone(1, first, none, std::nullopt)), (std::vector<std::uint32_t>{1}));
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
  const auto starts = warmth.ReadDone(0, in_flight, none, std::nullopt);
  ASSERT_EQ(Slots(starts), (std::vector<std::uint32_t>{0}));
  EXPECT_FALSE(starts[0].take_buffer_of);
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
  EXPECT_TRUE(warmth.ReadDone(0, in_flight, none, std::nullopt).empty());  // left to batch 2
  const auto starts = warmth.ReadDone(2, in_flight, none, std::nullopt);
  ASSERT_EQ(Slots(starts), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(starts[0].take_buffer_of, 0u);
  EXPECT_TRUE(warmth.Waiting(0));
  EXPECT_EQ(warmth.touched(), 2u);
}

TEST(BufferWarmth, TheFirstTwoBuffersGoToTheFirstTwoBatchesWhateverOrderTheyAreReadIn) {
  BufferWarmth warmth(5, true);
  const std::vector<std::uint32_t> none;
  const std::deque<std::uint32_t> in_flight{0, 1, 2};
  // Batches 1 and 2 read before batch 0: they wait, so that the first two
  // buffers are batch 0's and batch 1's (cold ones, for batch 2, only once
  // the loop waits for it).
  EXPECT_TRUE(warmth.ReadDone(2, in_flight, none, std::nullopt).empty());
  EXPECT_TRUE(warmth.ReadDone(1, in_flight, none, std::nullopt).empty());
  EXPECT_EQ(Slots(warmth.ReadDone(0, in_flight, none, std::nullopt)), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_TRUE(warmth.Waiting(2));
  EXPECT_EQ(warmth.touched(), 2u);
}

TEST(BufferWarmth, DroppingForgetsWaitingBatches) {
  BufferWarmth warmth(4, true);
  const std::vector<std::uint32_t> none;
  const std::deque<std::uint32_t> in_flight{0, 1, 2, 3};
  EXPECT_EQ(Slots(warmth.ReadDone(0, in_flight, none, std::nullopt)), (std::vector<std::uint32_t>{0}));
  EXPECT_EQ(Slots(warmth.ReadDone(1, in_flight, none, std::nullopt)), (std::vector<std::uint32_t>{1}));
  EXPECT_TRUE(warmth.ReadDone(2, in_flight, none, std::nullopt).empty());
  EXPECT_TRUE(warmth.ReadDone(3, in_flight, none, std::nullopt).empty());
  EXPECT_TRUE(warmth.Waiting(2));
  EXPECT_EQ(warmth.DropWaiting(), (std::vector<std::uint32_t>{2, 3}));
  EXPECT_FALSE(warmth.Waiting(2));
  EXPECT_TRUE(warmth.DropWaiting().empty());
  // The consumer waiting for a batch starts it in a cold buffer.
  EXPECT_EQ(Slots(warmth.ReadDone(2, in_flight, none, /*consumer_waits=*/2u)), (std::vector<std::uint32_t>{2}));
  EXPECT_EQ(warmth.touched(), 3u);
  // Without the rule every batch starts at once.
  BufferWarmth eager(4, false);
  for (std::uint32_t s = 0; s < 4; ++s)
    EXPECT_EQ(Slots(eager.ReadDone(s, in_flight, none, std::nullopt)), (std::vector<std::uint32_t>{s}));
  EXPECT_EQ(eager.touched(), 4u);
}

}  // namespace
}  // namespace stoker::pipeline
