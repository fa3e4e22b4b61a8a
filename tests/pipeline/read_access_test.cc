// The kernel's read-ahead on local shards (LoaderOptions::kernel_readahead):
// kAuto switches it off only for a global shuffle over shards larger than
// the page cache's room; the choice reaches every shard file (those open
// already and those opened later) and is said in the stats.
#include "pipeline/read_access.h"

#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "loader_test_util.h"

namespace stoker::pipeline {
namespace {

const io::PageCacheRoom kRoom{400ull << 20, "memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous"};

TEST(ReadAccess, AutoReadsAtRandomOnlyForAGlobalShuffleOverShardsLargerThanTheRoom) {
  auto larger = ChooseReadAccess(KernelReadahead::kAuto, Order::kShuffle, true, 500ull << 20, kRoom, 0);
  EXPECT_EQ(larger.pattern, AccessPattern::kRandom);
  EXPECT_EQ(larger.note,
            "kernel read-ahead off for the shards: a global shuffle over 500.0 MiB of shards, more than the page cache "
            "can hold (400.0 MiB: memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous), reads each sample where "
            "it lies; what the kernel read ahead would be evicted before use");
  auto fits = ChooseReadAccess(KernelReadahead::kAuto, Order::kShuffle, true, 400ull << 20, kRoom, 0);
  EXPECT_EQ(fits.pattern, AccessPattern::kNormal);
  EXPECT_NE(fits.note.find("they (400.0 MiB) fit the page cache (400.0 MiB"), std::string::npos) << fits.note;
  // The loader's own buffers, allocated after the room was measured, come off it.
  auto crowded = ChooseReadAccess(KernelReadahead::kAuto, Order::kShuffle, true, 400ull << 20, kRoom, 1 << 20);
  EXPECT_EQ(crowded.pattern, AccessPattern::kRandom);
  EXPECT_NE(crowded.note.find("(399.0 MiB: memory cgroup /job: limit 512.0 MiB, 112.0 MiB anonymous, less 1.0 MiB of "
                              "batch buffers)"),
            std::string::npos)
      << crowded.note;
  // Orders that read shard by shard keep it, whatever the sizes.
  for (Order order : {Order::kShardBlockShuffle, Order::kSequential}) {
    auto by_shard = ChooseReadAccess(KernelReadahead::kAuto, order, true, 500ull << 20, kRoom, 0);
    EXPECT_EQ(by_shard.pattern, AccessPattern::kNormal);
    EXPECT_NE(by_shard.note.find("shard by shard"), std::string::npos);
  }
  // An unknown room keeps the kernel's default.
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kAuto, Order::kShuffle, true, 500ull << 20, std::nullopt, 0).pattern,
            AccessPattern::kNormal);
}

TEST(ReadAccess, OnAndOffAreObeyedAndLooseFilesAreLeftAlone) {
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kOff, Order::kSequential, true, 1, kRoom, 0).pattern,
            AccessPattern::kRandom);
  EXPECT_EQ(ChooseReadAccess(KernelReadahead::kOn, Order::kShuffle, true, 500ull << 20, kRoom, 0).pattern,
            AccessPattern::kNormal);
  for (KernelReadahead option : {KernelReadahead::kAuto, KernelReadahead::kOff}) {
    auto loose = ChooseReadAccess(option, Order::kShuffle, false, 500ull << 20, kRoom, 0);
    EXPECT_EQ(loose.pattern, AccessPattern::kNormal);
    EXPECT_TRUE(loose.note.empty());
  }
}

// The loader's choice reaches the dataset's shard files, and
// Dataset::AdviseShardAccess reaches files opened before it too.
TEST(ReadAccess, TheLoadersChoiceReachesEveryShardFileItReads) {
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
TEST(ReadAccess, AShardOpenedAfterTheAdviceIsAdvisedWhenItOpens) {
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

}  // namespace
}  // namespace stoker::pipeline
