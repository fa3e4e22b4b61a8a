// The image loader's read-ahead choice (LoaderOptions::kernel_readahead,
// io/read_access.h) reaches every shard file it reads: those open already
// and those opened later.
#include <gtest/gtest.h>

#include <mutex>

#include "fault_file_system.h"
#include "loader_test_util.h"
#include "order/read_plan.h"

namespace stoker {
namespace {

// The loader's choice reaches the dataset's shard files, and
// Dataset::AdviseShardAccess reaches files opened before it too.
TEST(LoaderReadahead, TheLoadersChoiceReachesEveryShardFileItReads) {
  TempDir dir;
  MakeDataset(dir);  // packs dir/out
  testing::FaultFileSystem fs;
  fs.record_advice = true;
  auto opened = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::shared_ptr<const Dataset> dataset = std::move(opened).value();
  ASSERT_GT(dataset->shards().size(), 1u);

  auto run_epoch = [&](KernelReadahead option) {
    LoaderOptions o = SmallOptions();
    o.kernel_readahead = option;
    auto loader = Loader::Create(dataset, o);
    EXPECT_TRUE(loader.ok()) << loader.error().ToString();
    for (;;) {
      auto batch = (*loader)->Next();
      EXPECT_TRUE(batch.ok());
      if (!batch.ok() || !*batch) break;
    }
    return (*loader)->stats();
  };
  // A tiny dataset fits any page cache: the default leaves the files alone.
  LoaderStats stats = run_epoch(KernelReadahead::kAuto);
  EXPECT_TRUE(stats.kernel_readahead);
  EXPECT_NE(stats.readahead_note.find("fit the page cache"), std::string::npos) << stats.readahead_note;
  EXPECT_TRUE(fs.Advised().empty());

  stats = run_epoch(KernelReadahead::kOff);
  EXPECT_FALSE(stats.kernel_readahead);
  EXPECT_EQ(stats.readahead_note, "kernel read-ahead off for the shards (kernel_readahead=off)");
  auto advised = fs.Advised();
  EXPECT_EQ(advised.size(), dataset->shards().size());
  for (const auto& shard : dataset->shards())
    EXPECT_EQ(advised[shard.full_path], AccessPattern::kRandom) << shard.full_path;

  // Back on: the open files are told, and stay told.
  stats = run_epoch(KernelReadahead::kOn);
  EXPECT_TRUE(stats.kernel_readahead);
  for (const auto& [path, pattern] : fs.Advised()) EXPECT_EQ(pattern, AccessPattern::kNormal) << path;
}

// Files opened after the advice get it when they open.
TEST(LoaderReadahead, AShardOpenedAfterTheAdviceIsAdvisedWhenItOpens) {
  TempDir dir;
  MakeDataset(dir);
  testing::FaultFileSystem fs;
  fs.record_advice = true;
  auto dataset = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(dataset.ok());
  (*dataset)->AdviseShardAccess(AccessPattern::kRandom);
  EXPECT_TRUE(fs.Advised().empty());  // nothing open yet
  const auto& last = (*dataset)->shards().back();
  ASSERT_TRUE((*dataset)->ReadField(last.first_sample, 0).ok());
  const auto advised = fs.Advised();
  ASSERT_EQ(advised.size(), 1u);
  EXPECT_EQ(advised.at(last.full_path), AccessPattern::kRandom);
}

// What a loader over a remote dataset tells its cache: each epoch's shard
// visits once, in the order it reads them, the next epoch's made ahead of
// its start (order and visits off the loader's lock, pipeline/order_ahead.h)
// and the reading position as batches are delivered.
class RecordingPlanner final : public ShardReadPlanner {
 public:
  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) override {
    std::lock_guard lock(mu_);
    const std::uint64_t at = plan_.size();
    plan_.insert(plan_.end(), shards.begin(), shards.end());
    return at;
  }
  void AdvancePlan(std::uint64_t position) override {
    std::lock_guard lock(mu_);
    position_ = std::max(position_, position);
  }
  void ResetPlan() override {
    std::lock_guard lock(mu_);
    plan_.clear();
    position_ = 0;
    ++resets_;
  }
  std::uint64_t working_set_bytes() const override { return 1ull << 40; }
  std::uint64_t largest_shard_bytes() const override { return 1 << 20; }
  std::vector<std::uint32_t> plan() const {
    std::lock_guard lock(mu_);
    return plan_;
  }
  std::uint64_t position() const {
    std::lock_guard lock(mu_);
    return position_;
  }
  int resets() const {
    std::lock_guard lock(mu_);
    return resets_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<std::uint32_t> plan_;
  std::uint64_t position_ = 0;
  int resets_ = 0;
};

TEST(LoaderReadahead, ARemoteCacheIsToldEachEpochsReadsOnceInOrder) {
  TempDir dir;
  MakeDataset(dir);
  RecordingPlanner planner;
  testing::FaultFileSystem fs;
  fs.planner = &planner;
  auto opened = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::shared_ptr<const Dataset> dataset = std::move(opened).value();
  std::vector<order::ShardSpan> spans;
  for (const auto& s : dataset->shards()) spans.push_back({s.first_sample, s.num_samples});
  ASSERT_GT(spans.size(), 2u);
  LoaderOptions o = SmallOptions();
  o.order = Order::kShuffle;
  o.threads = 2;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  order::BatchPlan plan;
  plan.num_samples = dataset->num_samples();
  plan.global_batch = o.batch_size;
  const order::OrderSpec spec{order::OrderMode::kShuffle, o.seed, 8};
  auto visits_of = [&](std::uint64_t epoch) {
    return order::ShardVisits(order::EpochOrder(spec, epoch, spans), plan, spans, 0);
  };
  std::vector<std::uint32_t> expected;
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    const auto visits = visits_of(epoch);
    expected.insert(expected.end(), visits.begin(), visits.end());
    const std::uint64_t epoch_end = expected.size();
    std::uint64_t delivered = 0;
    for (;;) {
      auto batch = (*loader)->Next();
      ASSERT_TRUE(batch.ok()) << batch.error().ToString();
      if (!*batch) break;
      ++delivered;
      // Reading never runs past the epoch's own visits.
      EXPECT_LE(planner.position(), epoch_end) << "epoch " << epoch << " batch " << delivered;
    }
    EXPECT_EQ(delivered, (*loader)->batches_per_epoch());
    // Every epoch so far, each once and in order; the next may be told already.
    const auto told = planner.plan();
    ASSERT_GE(told.size(), expected.size());
    EXPECT_TRUE(std::equal(expected.begin(), expected.end(), told.begin())) << "epoch " << epoch;
  }
  // Into epoch 3: it is told (made ahead, or when scheduling reached it),
  // and perhaps epoch 4 after it, nothing else.
  std::vector<std::uint32_t> through_3 = expected, through_4;
  const auto third = visits_of(3), fourth = visits_of(4);
  through_3.insert(through_3.end(), third.begin(), third.end());
  through_4 = through_3;
  through_4.insert(through_4.end(), fourth.begin(), fourth.end());
  auto batch = (*loader)->Next();
  ASSERT_TRUE(batch.ok());
  const auto told = planner.plan();
  EXPECT_TRUE(told == through_3 || told == through_4) << told.size() << " visits told";
  EXPECT_EQ(planner.resets(), 1);  // at creation only: no epoch was restarted
}

}  // namespace
}  // namespace stoker
