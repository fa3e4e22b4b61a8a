// The order a Loader uses over local data and over a remote cache: kAuto
// resolved, a cache too small for the order refused with the sizes, and the
// predicted download volume of an epoch.
#include "pipeline/order_choice.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "loader_test_util.h"
#include "order/cache_model.h"
#include "order/read_plan.h"

namespace stoker::pipeline {
namespace {

// A remote cache as the loader sees it.
class CachePlanner final : public ShardReadPlanner {
 public:
  CachePlanner(std::uint64_t capacity, std::uint64_t largest) : capacity_(capacity), largest_(largest) {}
  std::uint64_t AppendPlan(std::span<const std::uint32_t>) override { return 0; }
  void AdvancePlan(std::uint64_t) override {}
  void ResetPlan() override {}
  std::uint64_t working_set_bytes() const override { return capacity_; }
  std::uint64_t largest_shard_bytes() const override { return largest_; }

 private:
  std::uint64_t capacity_, largest_;
};

// 48 small images in about twelve shards of four.
std::shared_ptr<const Dataset> ManyShards(const TempDir& dir) {
  for (int i = 0; i < 48; ++i)
    WriteFile(dir / ("src/c" + std::to_string(i % 3) + "/" + std::to_string(i) + ".jpg"),
              MakeJpeg(40 + i % 5, 30 + i % 7, static_cast<unsigned>(i)));
  PackOptions p;
  p.target_shard_bytes = 4 * (MakeJpeg(42, 33, 1).size() + 1536);
  return PackSource(dir, p);
}

struct Shards {
  TempDir dir;
  std::shared_ptr<const Dataset> dataset = ManyShards(dir);
  std::uint64_t total = 0, largest = 0;
  order::BatchPlan plan;
  Shards() {
    for (const auto& s : dataset->shards()) {
      total += s.size;
      largest = std::max(largest, s.size);
    }
    plan.num_samples = dataset->num_samples();
    plan.global_batch = 1;  // prefetch 2 and two held: four samples in flight, at most two shards
  }
  CachePlanner Cache(double shards_worth) const {
    return CachePlanner(static_cast<std::uint64_t>(shards_worth * static_cast<double>(largest)), largest);
  }
};

TEST(OrderChoice, LocalDataShufflesGloballyAndPredictsNothing) {
  Shards s;
  LoaderOptions o;
  auto choice = ChooseOrder(o, s.plan, *s.dataset, nullptr, 2);
  ASSERT_TRUE(choice.ok()) << choice.error().ToString();
  EXPECT_EQ(choice->order, Order::kShuffle);
  EXPECT_EQ(choice->spec.mode, order::OrderMode::kShuffle);
  EXPECT_TRUE(choice->note.empty());
  EXPECT_EQ(choice->predicted_epoch_download_bytes, 0u);
  o.shuffle = false;
  EXPECT_EQ(ChooseOrder(o, s.plan, *s.dataset, nullptr, 2)->order, Order::kSequential);
}

TEST(OrderChoice, AutoIsAGlobalShuffleWhenTheCacheHoldsEverythingAndShardBlockOtherwise) {
  Shards s;
  ASSERT_GE(s.dataset->shards().size(), 8u);
  LoaderOptions o;
  const CachePlanner everything(s.total, s.largest);
  auto all = ChooseOrder(o, s.plan, *s.dataset, &everything, 2);
  ASSERT_TRUE(all.ok()) << all.error().ToString();
  EXPECT_EQ(all->order, Order::kShuffle);
  EXPECT_EQ(all->predicted_epoch_download_bytes, s.total);  // each shard once, kept
  EXPECT_NE(all->note.find("auto: the cache holds the whole dataset"), std::string::npos) << all->note;

  const CachePlanner three = s.Cache(3);
  auto some = ChooseOrder(o, s.plan, *s.dataset, &three, 2);
  ASSERT_TRUE(some.ok()) << some.error().ToString();
  EXPECT_EQ(some->order, Order::kShardBlockShuffle);
  EXPECT_EQ(some->spec.shard_window, 1u);                    // three windows fit
  EXPECT_EQ(some->predicted_epoch_download_bytes, s.total);  // each shard read once
  EXPECT_FALSE(some->warning);
}

TEST(OrderChoice, AGlobalShuffleThroughASmallCacheIsPredictedAndWarned) {
  Shards s;
  LoaderOptions o;
  o.order = Order::kShuffle;
  const CachePlanner two = s.Cache(2);
  auto choice = ChooseOrder(o, s.plan, *s.dataset, &two, 2);
  ASSERT_TRUE(choice.ok()) << choice.error().ToString();
  EXPECT_EQ(choice->order, Order::kShuffle);
  // The prediction is the cache's replay over this rank's visits of epoch 0.
  std::vector<order::ShardSpan> spans;
  std::vector<std::uint64_t> sizes;
  for (const auto& sh : s.dataset->shards()) {
    spans.push_back({sh.first_sample, sh.num_samples});
    sizes.push_back(sh.size);
  }
  const auto visits = order::ShardVisits(order::EpochOrder(choice->spec, 0, spans), s.plan, spans, 0);
  EXPECT_EQ(choice->predicted_epoch_download_bytes, order::ReplayDownloads(visits, sizes, two.working_set_bytes()));
  EXPECT_GT(choice->predicted_epoch_download_bytes, s.total * 3 / 2);
  EXPECT_TRUE(choice->warning);
  EXPECT_NE(choice->note.find("order=\"shard_block\""), std::string::npos) << choice->note;
}

TEST(OrderChoice, ACacheTooSmallForTheOrderIsRefusedNamingTheSmallestThatWorks) {
  Shards s;
  LoaderOptions o;
  // shard_block reads two shards at once at a window boundary.
  const CachePlanner one_and_a_half = s.Cache(1.5);
  auto auto_order = ChooseOrder(o, s.plan, *s.dataset, &one_and_a_half, 2);
  ASSERT_FALSE(auto_order.ok());
  EXPECT_EQ(auto_order.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(auto_order.error().message().find("reads up to 2 shards at once"), std::string::npos)
      << auto_order.error().ToString();
  EXPECT_NE(auto_order.error().message().find("the next must download meanwhile"), std::string::npos);
  EXPECT_NE(auto_order.error().message().find("smallest cache that works"), std::string::npos);
  // An explicit window whose shards are all read at once, with no room for the next.
  o.order = Order::kShardBlockShuffle;
  o.shard_window = 3;
  const CachePlanner three = s.Cache(3);
  auto window = ChooseOrder(o, s.plan, *s.dataset, &three, 2);
  ASSERT_FALSE(window.ok());
  EXPECT_NE(window.error().message().find("order=shard_block with a window of 3 shards reads up to"), std::string::npos)
      << window.error().ToString();
  EXPECT_NE(window.error().message().find("or shard_window"), std::string::npos);
  // No order can read a shard the cache cannot hold.
  o.order = Order::kShuffle;
  const CachePlanner half = s.Cache(0.5);
  auto shuffle = ChooseOrder(o, s.plan, *s.dataset, &half, 2);
  ASSERT_FALSE(shuffle.ok());
  EXPECT_NE(shuffle.error().message().find("downloaded whole before it is read"), std::string::npos)
      << shuffle.error().ToString();
}

TEST(OrderChoice, PrefetchIsLoweredUntilTheBatchesInFlightFitTheCache) {
  Shards s;
  s.plan.global_batch = 2;
  LoaderOptions o;
  o.order = Order::kShardBlockShuffle;
  o.shard_window = 1;
  const CachePlanner four = s.Cache(4);
  // Eight prefetched and two held: twenty samples over about six shards.
  auto choice = ChooseOrder(o, s.plan, *s.dataset, &four, 8);
  ASSERT_TRUE(choice.ok()) << choice.error().ToString();
  EXPECT_LT(choice->max_prefetch, 8u);
  EXPECT_GE(choice->max_prefetch, 1u);
  EXPECT_NE(choice->note.find("prefetch lowered from 8 to"), std::string::npos) << choice->note;
  // What is in flight then, with the next shard, fits.
  std::vector<order::ShardSpan> spans;
  std::vector<std::uint32_t> shard_of(s.dataset->num_samples());
  for (std::uint32_t i = 0; i < s.dataset->shards().size(); ++i) {
    const auto& sh = s.dataset->shards()[i];
    spans.push_back({sh.first_sample, sh.num_samples});
    for (std::uint64_t k = 0; k < sh.num_samples; ++k) shard_of[sh.first_sample + k] = i;
  }
  const auto order = order::EpochOrder(choice->spec, 0, spans);
  const std::uint32_t at_once = ShardsTouchedAtOnce(order, shard_of, (choice->max_prefetch + 2) * 2);
  EXPECT_LE((at_once + 1) * s.largest, four.working_set_bytes() + s.largest / 4);  // shards differ a little in size
}

TEST(OrderChoice, ShardBlockOverShardsOfOneClassEachIsWarnedAbout) {
  // Four classes of sixteen images, packed in class order, about eight to a shard.
  TempDir dir;
  std::uint64_t bytes = 0;
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 16; ++i) {
      const std::string jpeg = MakeJpeg(40, 30, static_cast<unsigned>(c * 16 + i));
      WriteFile(dir / ("src/c" + std::to_string(c) + "/" + std::to_string(i) + ".jpg"), jpeg);
      bytes = std::max<std::uint64_t>(bytes, jpeg.size() + 1536);
    }
  PackOptions p;
  p.target_shard_bytes = 8 * bytes;
  auto by_class = PackSource(dir, p);
  std::uint64_t largest = 0;
  for (const auto& sh : by_class->shards()) largest = std::max(largest, sh.size);
  order::BatchPlan plan;
  plan.num_samples = by_class->num_samples();
  plan.global_batch = 8;
  LoaderOptions o;
  o.order = Order::kShardBlockShuffle;
  o.shard_window = 1;
  const CachePlanner cache(8 * largest, largest);
  auto choice = ChooseOrder(o, plan, *by_class, &cache, 1);
  ASSERT_TRUE(choice.ok()) << choice.error().ToString();
  EXPECT_TRUE(choice->warning);
  EXPECT_NE(choice->note.find("labels on average against"), std::string::npos) << choice->note;
  EXPECT_NE(choice->note.find("stoker pack --shuffle"), std::string::npos) << choice->note;
  // The same images packed with shuffle: shards mix classes, no warning.
  TempDir mixed_dir;
  std::filesystem::copy(dir / "src", mixed_dir / "src", std::filesystem::copy_options::recursive);
  p.shuffle = true;
  auto mixed = PackSource(mixed_dir, p);
  auto mixed_choice = ChooseOrder(o, plan, *mixed, &cache, 1);
  ASSERT_TRUE(mixed_choice.ok()) << mixed_choice.error().ToString();
  EXPECT_FALSE(mixed_choice->warning) << mixed_choice->note;
}

TEST(OrderChoice, ShardsTouchedAtOnceCountsTheBusiestRun) {
  const std::vector<std::uint32_t> shard_of = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  std::vector<std::uint64_t> in_order(12);
  for (std::uint64_t i = 0; i < 12; ++i) in_order[i] = i;
  const auto sequential = order::Permutation::Of(in_order);
  EXPECT_EQ(ShardsTouchedAtOnce(sequential, shard_of, 1), 1u);
  EXPECT_EQ(ShardsTouchedAtOnce(sequential, shard_of, 4), 2u);  // 1-4 crosses a boundary
  EXPECT_EQ(ShardsTouchedAtOnce(sequential, shard_of, 6), 3u);  // 3-8
  EXPECT_EQ(ShardsTouchedAtOnce(sequential, shard_of, 100), 3u);
  const auto interleaved = order::Permutation::Of({0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11});
  EXPECT_EQ(ShardsTouchedAtOnce(interleaved, shard_of, 2), 2u);
  EXPECT_EQ(ShardsTouchedAtOnce(interleaved, shard_of, 3), 3u);
}

}  // namespace
}  // namespace stoker::pipeline
