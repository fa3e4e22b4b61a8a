// The image loader's read-ahead choice (LoaderOptions::kernel_readahead,
// io/read_access.h) reaches every shard file it reads: those open already
// and those opened later.
#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "loader_test_util.h"

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

}  // namespace
}  // namespace stoker
