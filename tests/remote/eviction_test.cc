// The cache's policy as a pure function: the wanted set, Belady with a plan,
// LRU without one, and what may not go.
#include "remote/eviction.h"

#include <gtest/gtest.h>

namespace stoker::remote {
namespace {

TEST(Eviction, TheWantedSetIsTheShardsNeededSoonestThatFillTheCache) {
  const std::vector<std::uint64_t> sizes(6, 10);
  const std::vector<std::uint32_t> plan = {3, 1, 3, 4, 0, 5, 2};
  const Horizon h = ComputeHorizon(plan, /*plan_base=*/100, /*position=*/100, sizes, /*capacity=*/30);
  EXPECT_EQ(h.order, (std::vector<std::uint32_t>{3, 1, 4, 0, 5, 2}));
  EXPECT_EQ(h.wanted, 3u);  // 3, 1, 4 fill 30 bytes
  EXPECT_EQ(h.last_wanted_use, 103u);
  EXPECT_EQ(h.next_use[3], 100u);
  EXPECT_EQ(h.next_use[0], 104u);
  // From a later position, visits already made do not count.
  const Horizon later = ComputeHorizon(plan, 100, 103, sizes, 30);
  EXPECT_EQ(later.order.front(), 4u);
  EXPECT_EQ(later.next_use[3], kBeyond);
}

TEST(Eviction, AtLeastOneShardIsWantedEvenWhenLargerThanTheCache) {
  const std::vector<std::uint64_t> sizes = {100, 10};
  const std::vector<std::uint32_t> plan = {0, 1};
  const Horizon h = ComputeHorizon(plan, 0, 0, sizes, 50);
  EXPECT_EQ(h.wanted, 1u);
}

TEST(Eviction, BeladyWithAPlanLruWithout) {
  std::vector<EntryState> entries(4);
  for (std::uint32_t s = 0; s < 4; ++s) entries[s] = {true, true, 10 + s};
  Horizon h;
  h.next_use = {50, 10, kBeyond, 30};
  EXPECT_EQ(ChooseVictim(entries, h, 0), 2u);             // not needed again
  entries[2].evictable = false;                           // being read
  EXPECT_EQ(ChooseVictim(entries, h, 0), 0u);             // needed furthest ahead
  EXPECT_EQ(ChooseVictim(entries, h, 60), std::nullopt);  // all needed by 60 or pinned
  // Without a plan: least recently used.
  Horizon none;
  none.next_use.assign(4, kBeyond);
  entries[2].evictable = true;
  entries[1].last_use = 1;
  EXPECT_EQ(ChooseVictim(entries, none, 0), 1u);
  entries[1].present = false;  // absent entries never go
  EXPECT_EQ(ChooseVictim(entries, none, 0), 0u);
}

}  // namespace
}  // namespace stoker::remote
