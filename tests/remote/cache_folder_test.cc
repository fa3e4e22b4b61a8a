// The cache folder: names, the listing other processes see, and clean-up.
#include "remote/cache_folder.h"

#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::remote {
namespace {

std::vector<ShardDesc> Shards() {
  return {{"http://a/d/shard-0.tar", "shard-0.tar", 100, 1}, {"http://a/d/shard-1.tar", "shard-1.tar", 200, 2}};
}

TEST(CacheFolder, NamesEntriesByUrlAndChecksumAndListsWhatTheFolderHolds) {
  stoker::testing::TempDir dir;
  const auto shards = Shards();
  CacheFolder folder(FileSystem::Default(), dir.path(), shards);
  const std::string e0 = folder.EntryPath(0), e1 = folder.EntryPath(1);
  EXPECT_NE(e0, e1);
  EXPECT_TRUE(IsCacheEntryName(std::filesystem::path(e0).filename().string()));
  // Another version of a shard (another checksum) is another entry.
  auto changed = shards;
  changed[0].checksum = 99;
  EXPECT_NE(CacheFolder(FileSystem::Default(), dir.path(), changed).EntryPath(0), e0);

  stoker::testing::WriteFile(e0, std::string(100, 'x'));
  // A live process's download of shard 1 (pid 1 always lives) and a dead one's.
  stoker::testing::WriteFile(e1 + ".part-1-0", "partial");
  stoker::testing::WriteFile(e1 + ".part-999999999-0", "leftover");
  ASSERT_OK_AND_ASSIGN(auto listing, folder.List(shards));
  EXPECT_EQ(listing.on_disk, (std::vector<bool>{true, false}));
  EXPECT_EQ(listing.others_in_flight, 200u);  // counted at the shard's full size
  ASSERT_OK(folder.RemoveDeadPartials());
  EXPECT_TRUE(std::filesystem::exists(e1 + ".part-1-0"));
  EXPECT_FALSE(std::filesystem::exists(e1 + ".part-999999999-0"));
  EXPECT_EQ(PartialFileWriter("x.shard.part-1234-7"), 1234);
  EXPECT_EQ(PartialFileWriter("x.shard.part-abc"), 0);
  // Our own partial names are fresh each time and name this process.
  const std::string p = folder.NewPartialPath(1);
  EXPECT_NE(p, folder.NewPartialPath(1));
  EXPECT_EQ(PartialFileWriter(std::filesystem::path(p).filename().string()), ::getpid());
}

TEST(CacheFolder, ALinkInPlaceOfAnEntryIsNotAnEntry) {
  stoker::testing::TempDir dir;
  const auto shards = Shards();
  CacheFolder folder(FileSystem::Default(), dir.path(), shards);
  stoker::testing::WriteFile(dir / "elsewhere", std::string(100, 'x'));
  std::filesystem::create_symlink(dir / "elsewhere", folder.EntryPath(0));
  ASSERT_OK_AND_ASSIGN(auto listing, folder.List(shards));
  EXPECT_FALSE(listing.on_disk[0]);
}

}  // namespace
}  // namespace stoker::remote
