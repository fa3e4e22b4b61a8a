// Shards given as a folder (`stoker index FOLDER`, `stoker pack FOLDER OUT`),
// and shards that went missing or changed after indexing, found before any
// read.
#include <filesystem>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "dataset/pack_test_util.h"
#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::Keys;
using testing::PackInSmallShards;
using testing::TempDir;
using testing::WriteFile;

TEST(IndexShards, AFolderStandsForTheTarFilesInItInNameOrder) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto packed, PackInSmallShards(dir, "a"));
  ASSERT_GE(packed.shards, 3u);
  std::filesystem::remove(dir / "a/index.stoker");
  auto unindexed = Dataset::Open(dir / "a");
  ASSERT_FALSE(unindexed.ok());
  EXPECT_NE(unindexed.error().message().find(fmt::format("holds {} .tar file(s)", packed.shards)), std::string::npos)
      << unindexed.error().message();
  WriteFile(dir / "a/notes.txt", "not a shard");
  std::filesystem::create_directories(dir / "a/sub.tar");  // a folder named like a shard is not one

  ASSERT_OK_AND_ASSIGN(auto indexed, IndexShards({dir / "a"}));
  EXPECT_EQ(indexed.samples, 5u);
  EXPECT_EQ(indexed.shards, packed.shards);
  EXPECT_EQ(indexed.index_path, dir / "a/index.stoker");  // beside the first shard
  ASSERT_OK_AND_ASSIGN(auto d, Dataset::Open(dir / "a"));
  for (std::size_t i = 0; i < d->shards().size(); ++i)
    EXPECT_EQ(d->shards()[i].path, fmt::format("shard-{:06}.tar", i));
  EXPECT_TRUE(Verify(*d)->ok());

  std::filesystem::create_directories(dir / "empty");
  auto none = IndexShards({dir / "empty"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.error().message().find("folder '" + (dir / "empty") + "' holds no .tar shards"), std::string::npos)
      << none.error().message();
}

TEST(Pack, AFolderOfShardsIsPackedAsItsShardsButAnImageFolderWithATarInItIsNot) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto first, PackInSmallShards(dir, "a"));
  ASSERT_GE(first.shards, 3u);
  ASSERT_OK_AND_ASSIGN(auto repacked, Pack(dir / "a", dir / "b"));  // a folder of shards (and its index)
  EXPECT_EQ(repacked.samples, 5u);
  ASSERT_OK_AND_ASSIGN(auto a, Dataset::Open(dir / "a"));
  ASSERT_OK_AND_ASSIGN(auto b, Dataset::Open(dir / "b"));
  EXPECT_EQ(Keys(*a), Keys(*b));
  // The labels' names the folder's index keeps go on (repacking to shuffle must not lose them).
  EXPECT_EQ(repacked.class_names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(b->class_names(), a->class_names());
  // An ImageFolder tree with a stray archive beside its class folders is still an ImageFolder.
  std::filesystem::copy_file(dir / "a/shard-000000.tar", dir / "src/backup.tar");
  ASSERT_OK_AND_ASSIGN(auto again, Pack(dir / "src", dir / "c"));
  EXPECT_EQ(again.samples, 5u);
  ASSERT_OK_AND_ASSIGN(auto c, Dataset::Open(dir / "c"));
  EXPECT_EQ(Keys(*a), Keys(*c));
  a.reset();  // its index is damaged next
  // A damaged index beside the shards: named, and its names left.
  std::filesystem::resize_file(dir / "a/index.stoker", std::filesystem::file_size(dir / "a/index.stoker") / 2);
  PackOptions replace;
  replace.overwrite = true;
  ASSERT_OK_AND_ASSIGN(auto stale, Pack(dir / "a", dir / "b", replace));
  EXPECT_TRUE(stale.class_names.empty());
  ASSERT_EQ(stale.warnings.size(), 1u);
  EXPECT_NE(stale.warnings[0].find("does not open"), std::string::npos) << stale.warnings[0];
}

TEST(Pack, RepackingADatasetKeepsTheFieldKindsItsIndexRecords) {
  TempDir dir;
  WriteFile(dir / "m/a.jpg", testing::FakeImage("jpg", 900, 1));
  WriteFile(dir / "m/b.jpg", testing::FakeImage("jpg", 800, 2));
  WriteFile(dir / "m/list.jsonl",
            "{\"path\": \"a.jpg\", \"caption\": \"a cat\", \"score\": 0.5}\n"
            "{\"path\": \"b.jpg\", \"caption\": \"a dog\", \"score\": 2}\n");
  ASSERT_OK(Pack(dir / "m/list.jsonl", dir / "a").status());
  PackOptions shuffled;
  shuffled.shuffle = true;
  ASSERT_OK(Pack(dir / "a", dir / "b", shuffled).status());
  ASSERT_OK_AND_ASSIGN(auto a, Dataset::Open(dir / "a"));
  ASSERT_OK_AND_ASSIGN(auto b, Dataset::Open(dir / "b"));
  ASSERT_EQ(b->field_names(), a->field_names());
  EXPECT_EQ(b->recorded_field(*b->FieldIndex("caption")).kind, FieldKind::kText);
  EXPECT_EQ(b->recorded_field(*b->FieldIndex("score")).kind, FieldKind::kFloat);
  for (std::size_t f = 0; f < a->field_names().size(); ++f)
    EXPECT_EQ(b->recorded_field(f).kind, a->recorded_field(f).kind) << a->field_names()[f];
}

TEST(Dataset, ClassNamesAreKeptByPackAndReadFromLooseFoldersNotInventedByIndex) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto packed, PackInSmallShards(dir, "out"));
  EXPECT_EQ(packed.class_names, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_OK_AND_ASSIGN(auto from_pack, Dataset::Open(dir / "out"));
  EXPECT_EQ(from_pack->class_names(), packed.class_names);
  ASSERT_OK_AND_ASSIGN(auto loose, Dataset::OpenImageFolder(dir / "src", FileSystem::Default()));
  EXPECT_EQ(loose->class_names(), packed.class_names);
  // `stoker index` over the same shards: their .cls are numbers, with no names to keep.
  IndexOptions options;
  options.output = dir / "reindexed.stoker";
  ASSERT_OK(IndexShards({dir / "out"}, options).status());
  ASSERT_OK_AND_ASSIGN(auto reindexed, Dataset::Open(dir / "reindexed.stoker"));
  EXPECT_TRUE(reindexed->class_names().empty());
  EXPECT_EQ(reindexed->num_samples(), from_pack->num_samples());
}

TEST(Dataset, AMissingOrResizedShardIsNamedBeforeAnyRead) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto packed, PackInSmallShards(dir, "out"));
  ASSERT_GE(packed.shards, 3u);
  {
    ASSERT_OK_AND_ASSIGN(auto whole, Dataset::Open(dir / "out"));
    EXPECT_TRUE(whole->CheckShardFiles(/*sizes=*/true).ok());
  }
  std::filesystem::resize_file(dir / "out/shard-000002.tar", 600);
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));  // opening reads no shard
  EXPECT_TRUE(dataset->CheckShardFiles(/*sizes=*/false).ok());
  auto resized = dataset->CheckShardFiles(/*sizes=*/true);
  ASSERT_FALSE(resized.ok());
  EXPECT_EQ(resized.code(), StatusCode::kCorruption);
  EXPECT_NE(resized.message().find("'shard-000002.tar' is 600 bytes, the index says"), std::string::npos)
      << resized.message();
  std::filesystem::remove(dir / "out/shard-000001.tar");
  auto missing = dataset->CheckShardFiles(/*sizes=*/true);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find(fmt::format("1 of the {} shards that index", packed.shards)), std::string::npos)
      << missing.message();
  EXPECT_NE(missing.message().find("'shard-000001.tar' (stat"), std::string::npos) << missing.message();
}

}  // namespace
}  // namespace stoker
