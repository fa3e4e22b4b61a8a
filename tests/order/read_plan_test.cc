// What the loader tells a remote cache about its future reads.
#include "order/read_plan.h"

#include <gtest/gtest.h>

namespace stoker::order {
namespace {

class RecordingPlanner final : public ShardReadPlanner {
 public:
  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) override {
    const std::uint64_t at = base + plan.size();
    plan.insert(plan.end(), shards.begin(), shards.end());
    return at;
  }
  void AdvancePlan(std::uint64_t p) override { positions.push_back(p); }
  void ResetPlan() override {
    base += plan.size();
    plan.clear();
    ++resets;
  }
  std::uint64_t working_set_bytes() const override { return 0; }
  std::uint64_t largest_shard_bytes() const override { return 0; }

  std::vector<std::uint32_t> plan;
  std::uint64_t base = 0;
  std::vector<std::uint64_t> positions;
  int resets = 0;
};

// Three shards of four samples; batches of four; sequential order.
struct ThreeShards {
  OrderSpec spec{OrderMode::kSequential, 0, 8};
  BatchPlan plan;
  std::vector<ShardSpan> shards = {{0, 4}, {4, 4}, {8, 4}};
  ThreeShards() {
    plan.num_samples = 12;
    plan.global_batch = 4;
  }
};

EpochVisits MadeAhead(const ThreeShards& s, std::uint64_t epoch) {
  return *EpochVisitsUnlessStopped(EpochOrder(s.spec, epoch, s.shards), s.plan, s.shards, std::stop_token());
}

TEST(ReadAheadAnnouncer, AnnouncesAnEpochAndTheNextMadeAheadWithRepeatsCollapsed) {
  ThreeShards s;
  RecordingPlanner planner;
  ReadAheadAnnouncer announcer(&planner, s.plan, s.shards);
  EXPECT_TRUE(announcer.active());
  announcer.Restart(0, 0, EpochOrder(s.spec, 0, s.shards));
  // Epoch 0 visits shards 0, 1, 2 (one visit per shard).
  EXPECT_EQ(planner.plan, (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(planner.resets, 1);
  EXPECT_EQ(planner.positions, (std::vector<std::uint64_t>{0}));  // reading is at batch 0
  // Epoch 2 made ahead before epoch 1 is not announced: the plan is in the order of reading.
  announcer.AnnounceAhead(2, MadeAhead(s, 2));
  EXPECT_EQ(planner.plan.size(), 3u);
  // Epoch 1's visits, made ahead, are announced; twice is once.
  announcer.AnnounceAhead(1, MadeAhead(s, 1));
  announcer.AnnounceAhead(1, MadeAhead(s, 1));
  EXPECT_EQ(planner.plan, (std::vector<std::uint32_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_TRUE(announcer.IsAnnounced(1));
  announcer.Advance(0, 2);
  EXPECT_EQ(planner.positions.back(), 2u);  // batch 2 starts at the third visit
  // Scheduling into epoch 1 (announced already) adds nothing.
  announcer.EpochScheduled(1, EpochOrder(s.spec, 1, s.shards));
  EXPECT_EQ(planner.plan.size(), 6u);
  announcer.Advance(1, 1);
  EXPECT_EQ(planner.positions.back(), 4u);
  // Scheduling into epoch 2 with nothing made ahead lists its visits then.
  announcer.EpochScheduled(2, EpochOrder(s.spec, 2, s.shards));
  EXPECT_EQ(planner.plan.size(), 9u);
  announcer.Advance(2, 0);
  EXPECT_EQ(planner.positions.back(), 6u);
}

// The visits made ahead are ShardVisits' of the whole epoch, with the same
// batch starts; a stopped token gives nothing.
TEST(ReadAheadAnnouncer, VisitsMadeAheadAreTheEpochsShardVisits) {
  OrderSpec spec{OrderMode::kShuffle, 7, 8};
  BatchPlan plan;
  plan.num_samples = 5000;
  plan.global_batch = 6;
  plan.world_size = 3;
  plan.rank = 1;
  std::vector<ShardSpan> shards;
  for (std::uint64_t first = 0; first < plan.num_samples; first += 37)
    shards.push_back({first, std::min<std::uint64_t>(37, plan.num_samples - first)});
  const Permutation order = EpochOrder(spec, 3, shards);
  std::vector<std::uint64_t> batch_start;
  const std::vector<std::uint32_t> visits = ShardVisits(order, plan, shards, 0, &batch_start);
  const auto made = EpochVisitsUnlessStopped(order, plan, shards, std::stop_token());
  ASSERT_TRUE(made.has_value());
  EXPECT_EQ(made->visits, visits);
  EXPECT_EQ(made->batch_start, batch_start);
  EXPECT_EQ(made->batch_start.size(), plan.NumBatches() + 1);
  std::stop_source stopped;
  stopped.request_stop();
  EXPECT_FALSE(EpochVisitsUnlessStopped(order, plan, shards, stopped.get_token()).has_value());
}

// Shards of six samples read in batches of four: batch 1 (samples 4-7)
// starts in shard 0, which batch 0 began. Until batch 1 is delivered, shard 0
// is still being read, so reaching batch 1 must not move past shard 0's
// visit (the cache would take it for done and evict it while in use).
TEST(ReadAheadAnnouncer, ABatchThatContinuesAShardStartsAtThatShardsVisit) {
  OrderSpec spec{OrderMode::kSequential, 0, 8};
  BatchPlan plan;
  plan.num_samples = 18;
  plan.global_batch = 4;
  const std::vector<ShardSpan> shards = {{0, 6}, {6, 6}, {12, 6}};
  RecordingPlanner planner;
  ReadAheadAnnouncer announcer(&planner, plan, shards);
  announcer.Restart(0, 0, EpochOrder(spec, 0, shards));
  ASSERT_EQ(std::vector<std::uint32_t>(planner.plan.begin(), planner.plan.begin() + 3),
            (std::vector<std::uint32_t>{0, 1, 2}));
  // Batches: 0 = 0-3 (shard 0), 1 = 4-7 (shards 0, 1), 2 = 8-11 (shard 1),
  // 3 = 12-15 (shard 2), 4 = 16-17 (shard 2).
  const std::vector<std::uint64_t> expected = {0, 0, 1, 2, 2};
  for (std::uint64_t b = 0; b < 5; ++b) {
    announcer.Advance(0, b);
    EXPECT_EQ(planner.positions.back(), expected[b]) << "batch " << b;
  }
}

TEST(ReadAheadAnnouncer, ARestoreAnnouncesFromTheResumedBatch) {
  ThreeShards s;
  RecordingPlanner planner;
  ReadAheadAnnouncer announcer(&planner, s.plan, s.shards);
  announcer.Restart(3, 2, EpochOrder(s.spec, 3, s.shards));
  EXPECT_EQ(planner.plan, (std::vector<std::uint32_t>{2}));  // batch 2 of epoch 3
  announcer.AnnounceAhead(4, MadeAhead(s, 4));
  EXPECT_EQ(planner.plan, (std::vector<std::uint32_t>{2, 0, 1, 2}));  // then epoch 4
  EXPECT_EQ(planner.positions, (std::vector<std::uint64_t>{0}));
}

TEST(ReadAheadAnnouncer, WithoutAPlannerNothingHappens) {
  ThreeShards s;
  ReadAheadAnnouncer announcer(nullptr, s.plan, s.shards);
  EXPECT_FALSE(announcer.active());
  announcer.Restart(0, 0, EpochOrder(s.spec, 0, s.shards));
  announcer.Advance(0, 1);
  EXPECT_EQ(announcer.ShardOf(5), 1u);
  EXPECT_EQ(announcer.ShardOf(11), 2u);
}

}  // namespace
}  // namespace stoker::order
