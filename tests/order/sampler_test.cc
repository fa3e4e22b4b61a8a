#include "order/sampler.h"

#include <algorithm>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "core/rng.h"

namespace stoker::order {
namespace {

TEST(Rng, IsThePinnedSequence) {
  // The exact values are part of every user's epoch order: a change here
  // changes their shuffles, so it must be deliberate. (g++ 12 and clang 14
  // give these same values.)
  Rng rng(0, 0);
  EXPECT_EQ(rng.Next(), 0x4b5e53214694a344ull);
  EXPECT_EQ(rng.Next(), 0x3e635b8e81d77befull);
  EXPECT_EQ(rng.Next(), 0x373f766dc18978d3ull);
  Rng other_stream(0, 1);
  EXPECT_NE(other_stream.Next(), 0x4b5e53214694a344ull);
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafull);  // the published SplitMix64 value for state 0
  std::vector<int> v = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  Rng shuffle_rng(7, 3);
  Shuffle(v.data(), v.size(), shuffle_rng);
  EXPECT_EQ(v, (std::vector<int>{2, 9, 6, 4, 7, 3, 8, 0, 1, 5}));
}

TEST(Rng, BelowIsUniformEnough) {
  Rng rng(42, 7);
  std::vector<int> counts(10);
  for (int i = 0; i < 100000; ++i) counts[rng.Below(10)]++;
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
  for (int i = 0; i < 1000; ++i) {
    double u = rng.Uniform01();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

std::vector<ShardSpan> Shards(std::vector<std::uint64_t> sizes) {
  std::vector<ShardSpan> out;
  std::uint64_t first = 0;
  for (auto n : sizes) {
    out.push_back({first, n});
    first += n;
  }
  return out;
}

TEST(EpochOrder, IsAPermutationAndAFunctionOfSeedAndEpoch) {
  auto shards = Shards({100, 50, 73});
  for (auto mode : {OrderMode::kSequential, OrderMode::kShuffle, OrderMode::kShardBlockShuffle}) {
    OrderSpec spec{mode, 7, 2};
    auto a = EpochOrder(spec, 3, shards);
    EXPECT_TRUE(a.narrow());
    auto sorted = a.ToVector();
    std::sort(sorted.begin(), sorted.end());
    std::vector<std::uint64_t> expected(223);
    std::iota(expected.begin(), expected.end(), 0u);
    EXPECT_EQ(sorted, expected);
    EXPECT_EQ(EpochOrder(spec, 3, shards), a);
    if (mode != OrderMode::kSequential) {
      EXPECT_NE(EpochOrder(spec, 4, shards), a);
      spec.seed = 8;
      EXPECT_NE(EpochOrder(spec, 3, shards), a);
    }
  }
}

// Orders are held in 4 bytes a position below 2^32 samples: the order is
// the one 8-byte storage gives, position by position, in every mode.
TEST(EpochOrder, TheWidthItIsHeldInChangesNothing) {
  auto shards = Shards({100, 50, 73, 1, 0, 300});
  for (auto mode : {OrderMode::kSequential, OrderMode::kShuffle, OrderMode::kShardBlockShuffle})
    for (std::uint64_t seed : {0u, 7u})
      for (std::uint64_t epoch : {0u, 1u, 9u}) {
        const OrderSpec spec{mode, seed, 2};
        const Permutation narrow = EpochOrderIn(false, spec, epoch, shards);
        const Permutation wide = EpochOrderIn(true, spec, epoch, shards);
        ASSERT_TRUE(narrow.narrow());
        ASSERT_FALSE(wide.narrow());
        EXPECT_EQ(narrow.ToVector(), wide.ToVector());
        EXPECT_EQ(narrow, wide);
      }
  const Permutation big = Permutation::Of({5, std::uint64_t{1} << 32, 0});
  EXPECT_FALSE(big.narrow()) << "a sample number over 32 bits is held in 8 bytes";
  EXPECT_EQ(big[1], std::uint64_t{1} << 32);
  EXPECT_EQ(big.size(), 3u);
  EXPECT_TRUE(Permutation::Of({5, 0xFFFFFFFFu, 0}).narrow());
  EXPECT_NE(big, Permutation::Of({5, 0, 0}));
}

TEST(EpochOrder, ShardBlockKeepsWindowsTogether) {
  auto shards = Shards({10, 10, 10, 10});
  OrderSpec spec{OrderMode::kShardBlockShuffle, 1, 2};
  auto order = EpochOrder(spec, 0, shards);
  // The first 20 samples come from exactly two shards.
  std::set<std::uint64_t> first_window;
  for (int i = 0; i < 20; ++i) first_window.insert(order[i] / 10);
  EXPECT_EQ(first_window.size(), 2u);
}

TEST(BatchPlan, RanksPartitionEachGlobalBatch) {
  BatchPlan plan{103, 12, 4, 0, false};
  ASSERT_TRUE(plan.Validate().ok());
  EXPECT_EQ(plan.NumBatches(), 9u);
  std::vector<std::uint64_t> seen;
  std::vector<std::uint64_t> positions;
  for (std::uint64_t k = 0; k < plan.NumBatches(); ++k) {
    std::size_t sizes = 0;
    for (std::uint32_t r = 0; r < 4; ++r) {
      BatchPlan p = plan;
      p.rank = r;
      p.RankPositions(k, positions);
      if (r == 0) sizes = positions.size();
      EXPECT_EQ(positions.size(), sizes) << "every rank gets the same batch size";
      seen.insert(seen.end(), positions.begin(), positions.end());
    }
  }
  // 103 = 8 * 12 + 7: the last global batch is padded to 8 by wrapping to position 0.
  EXPECT_EQ(seen.size(), 104u);
  std::set<std::uint64_t> unique(seen.begin(), seen.end());
  EXPECT_EQ(unique.size(), 103u);
  plan.drop_last = true;
  EXPECT_EQ(plan.NumBatches(), 8u);
}

// Elastic training: any world size, shares differ by at most one, and the
// epoch is covered exactly once even when the world size changes between
// global batches.
TEST(BatchPlan, BalancedSplitCoversEachSampleOnceAcrossWorldSizeChanges) {
  const std::uint64_t n = 103, global = 12;
  BatchPlan plan{n, global, 5, 0, false, true};
  ASSERT_TRUE(plan.Validate().ok());  // 12 is not a multiple of 5: fine when balanced
  EXPECT_EQ(plan.NumBatches(), 9u);
  EXPECT_EQ(plan.MaxRankBatch(), 3u);
  const std::uint32_t worlds[] = {5, 3, 3, 1, 7, 2, 12, 13, 4};  // one per global batch
  std::vector<std::uint64_t> seen, positions;
  for (std::uint64_t k = 0; k < plan.NumBatches(); ++k) {
    BatchPlan p = plan;
    p.world_size = worlds[k];
    const std::uint64_t size = std::min(global, n - k * global);
    std::size_t smallest = SIZE_MAX, largest = 0, total = 0;
    std::uint64_t expected_next = k * global;
    for (std::uint32_t r = 0; r < p.world_size; ++r) {
      p.rank = r;
      p.RankPositions(k, positions);
      smallest = std::min(smallest, positions.size());
      largest = std::max(largest, positions.size());
      total += positions.size();
      for (std::uint64_t pos : positions) EXPECT_EQ(pos, expected_next++) << "ranks take contiguous runs in order";
      EXPECT_LE(positions.size(), p.MaxRankBatch());
      seen.insert(seen.end(), positions.begin(), positions.end());
    }
    EXPECT_EQ(total, size);
    EXPECT_LE(largest - smallest, 1u) << "batch " << k << " world " << p.world_size;
  }
  ASSERT_EQ(seen.size(), n) << "nothing padded";
  EXPECT_EQ(std::set<std::uint64_t>(seen.begin(), seen.end()).size(), n);
  // The last batch has 7 samples: with 13 ranks, six get none.
  BatchPlan last = plan;
  last.world_size = 13;
  last.rank = 0;
  last.RankPositions(8, positions);
  EXPECT_TRUE(positions.empty());
}

// RankSamplesPerEpoch (len(loader.sampler)) is what RankPositions hands out,
// over both splits, drop_last, and shapes where the last batch is short,
// empty for some ranks, or exact.
TEST(BatchPlan, RankSamplesPerEpochIsTheSumOfTheRanksPositions) {
  std::vector<std::uint64_t> positions;
  for (const bool balanced : {false, true})
    for (const bool drop_last : {false, true})
      for (const std::uint64_t n : {0u, 1u, 7u, 96u, 103u, 1000u})
        for (const std::uint32_t world : {1u, 3u, 4u, 13u}) {
          const std::uint64_t global = balanced ? 12 : 12 * world / std::gcd(12u, world);
          for (std::uint32_t rank = 0; rank < world; ++rank) {
            const BatchPlan plan{n, global, world, rank, drop_last, balanced};
            ASSERT_TRUE(plan.Validate().ok());
            std::uint64_t total = 0;
            for (std::uint64_t k = 0; k < plan.NumBatches(); ++k) {
              plan.RankPositions(k, positions);
              total += positions.size();
            }
            EXPECT_EQ(plan.RankSamplesPerEpoch(), total) << "n " << n << " world " << world << " rank " << rank
                                                         << " balanced " << balanced << " drop_last " << drop_last;
          }
        }
}

TEST(BatchPlan, ValidatesArguments) {
  EXPECT_FALSE((BatchPlan{10, 10, 3, 0, false}).Validate().ok());  // 10 % 3
  EXPECT_FALSE((BatchPlan{10, 12, 4, 4, false}).Validate().ok());  // rank out of range
  EXPECT_FALSE((BatchPlan{10, 0, 1, 0, false}).Validate().ok());
}

}  // namespace
}  // namespace stoker::order
