// The cache replay: the remote cache's eviction rule (the shard needed
// furthest ahead goes), checked against a plain reference on random visits.
#include "order/cache_model.h"

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace stoker::order {
namespace {

// Quadratic and obvious: at a miss, scan forward for each cached shard's
// next use; evict the one needed last (ties: the higher shard index).
std::uint64_t ReferenceReplay(const std::vector<std::uint32_t>& visits, const std::vector<std::uint64_t>& sizes,
                              std::uint64_t capacity) {
  std::vector<std::uint32_t> cached;
  std::uint64_t used = 0, downloaded = 0;
  for (std::size_t i = 0; i < visits.size(); ++i) {
    const std::uint32_t s = visits[i];
    if (std::find(cached.begin(), cached.end(), s) != cached.end()) continue;
    downloaded += sizes[s];
    if (sizes[s] > capacity) continue;
    while (used + sizes[s] > capacity) {
      auto next_use = [&](std::uint32_t c) {
        for (std::size_t j = i + 1; j < visits.size(); ++j)
          if (visits[j] == c) return static_cast<std::uint64_t>(j);
        return std::numeric_limits<std::uint64_t>::max();
      };
      auto victim = std::max_element(cached.begin(), cached.end(), [&](std::uint32_t a, std::uint32_t b) {
        return std::pair(next_use(a), a) < std::pair(next_use(b), b);
      });
      used -= sizes[*victim];
      cached.erase(victim);
    }
    cached.push_back(s);
    used += sizes[s];
  }
  return downloaded;
}

TEST(CacheModel, ACacheThatHoldsEverythingDownloadsEachShardOnce) {
  const std::vector<std::uint64_t> sizes = {10, 20, 30};
  const std::vector<std::uint32_t> visits = {0, 1, 2, 0, 1, 2, 2, 1, 0};
  EXPECT_EQ(ReplayDownloads(visits, sizes, 60), 60u);
}

TEST(CacheModel, TheShardNeededFurthestAheadGoes) {
  // Two fit. At the visit of 2, shard 1 is needed before shard 0: 0 goes,
  // so the later visit of 1 hits and only 0 is fetched again.
  const std::vector<std::uint64_t> sizes = {1, 1, 1};
  const std::vector<std::uint32_t> visits = {0, 1, 2, 1, 0};
  EXPECT_EQ(ReplayDownloads(visits, sizes, 2), 4u);
}

TEST(CacheModel, AShardLargerThanTheCacheIsFetchedAtEveryVisit) {
  const std::vector<std::uint64_t> sizes = {5, 100};
  const std::vector<std::uint32_t> visits = {0, 1, 0, 1, 0};
  EXPECT_EQ(ReplayDownloads(visits, sizes, 10), 5u + 100u + 100u);
}

TEST(CacheModel, MatchesTheReferenceOnRandomVisitsAndSizes) {
  std::mt19937 rng(11);
  for (int round = 0; round < 200; ++round) {
    const std::size_t shards = 1 + rng() % 12;
    std::vector<std::uint64_t> sizes(shards);
    for (auto& s : sizes) s = 1 + rng() % 9;
    std::vector<std::uint32_t> visits(rng() % 80);
    for (auto& v : visits) v = static_cast<std::uint32_t>(rng() % shards);
    const std::uint64_t capacity = rng() % 40;
    ASSERT_EQ(ReplayDownloads(visits, sizes, capacity), ReferenceReplay(visits, sizes, capacity))
        << "round " << round << " capacity " << capacity;
  }
}

}  // namespace
}  // namespace stoker::order
