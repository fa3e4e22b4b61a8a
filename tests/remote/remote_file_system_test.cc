// The remote file system: the index download bounded by its own header and
// the cache's limits, truthful Stat, and names shown without secrets.
#include "remote/remote_file_system.h"

#include <filesystem>

#include <gtest/gtest.h>

#include "format/index_format.h"
#include "remote/fake_transport.h"
#include "test_util.h"

namespace stoker::remote {
namespace {

using testing::FakeTransport;
using testing::SharedTransport;

// An index-shaped object: the magic, then a header claiming `claimed` bytes.
std::vector<std::byte> IndexClaiming(std::uint64_t claimed, std::size_t actual) {
  std::vector<std::byte> out(actual, std::byte{0});
  std::memcpy(out.data(), index_format::kMagic, sizeof(index_format::kMagic));
  std::memcpy(out.data() + index_format::header::kFileSizeOff, &claimed, 8);
  return out;
}

struct Fixture {
  ::stoker::testing::TempDir dir;
  FakeTransport fake;
  std::unique_ptr<RemoteFileSystem> Make(std::uint64_t capacity) {
    RemoteOptions o;
    o.cache.dir = dir.path();
    o.cache.capacity_bytes = capacity;
    o.cache.min_free_bytes = 0;
    o.max_attempts = 2;
    o.backoff_initial_seconds = 0.001;
    return std::make_unique<RemoteFileSystem>(o, std::make_unique<SharedTransport>(&fake), FileSystem::Default());
  }
  std::uint64_t CachedBytes() const {
    std::uint64_t n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir.path()))
      if (e.is_regular_file()) n += e.file_size();
    return n;
  }
};

TEST(RemoteFileSystem, AnIndexClaimingMoreThanTheCacheHoldsIsRefusedAtItsHeader) {
  Fixture f;
  const std::string url = "http://store/d/index.stoker";
  f.fake.Put(url, IndexClaiming(std::uint64_t{1} << 62, 256 << 10));
  auto fs = f.Make(/*capacity=*/10 << 20);
  auto info = fs->Stat(url);
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(info.error().message().find("the index says it is 4.0 EiB, more than the cache may hold (10.0 MiB"),
            std::string::npos)
      << info.error().message();
  EXPECT_EQ(f.CachedBytes(), 0u);              // nothing kept
  EXPECT_EQ(f.fake.requests(url).size(), 1u);  // not retried: more bytes cannot help
}

TEST(RemoteFileSystem, AnIndexLongerThanItsHeaderSaysOrNotAnIndexIsRefused) {
  Fixture f;
  const std::string longer = "http://store/a/index.stoker", other = "http://store/b/index.stoker";
  f.fake.Put(longer, IndexClaiming(1000, 5000));
  f.fake.Put(other, std::vector<std::byte>(4096, std::byte{'<'}));
  auto fs = f.Make(10 << 20);
  auto a = fs->Stat(longer);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message().find("larger than"), std::string::npos) << a.error().message();
  auto b = fs->Stat(other);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().code(), StatusCode::kCorruption);
  EXPECT_NE(b.error().message().find("neither a stoker index nor a Megatron .idx (bad magic)"), std::string::npos)
      << b.error().message();
  EXPECT_EQ(f.CachedBytes(), 0u);
}

TEST(RemoteFileSystem, StatAnswersTruthfullyAndNamesHideSecrets) {
  Fixture f;
  const std::string url = "https://user:pw@store/d/index.stoker?token=abc";
  f.fake.Put(url, IndexClaiming(512, 512));
  auto fs = f.Make(10 << 20);
  ASSERT_OK_AND_ASSIGN(auto info, fs->Stat(url));
  EXPECT_EQ(info.type, FileType::kRegular);
  EXPECT_EQ(info.size, 512u);
  EXPECT_EQ(f.fake.requests(url).size(), 1u);
  ASSERT_OK(fs->Map(url).status());  // the fetched index is reused
  EXPECT_EQ(f.fake.requests(url).size(), 1u);
  const std::string shard = fs->Sibling(url, "shard-000000.tar");
  EXPECT_EQ(shard, "https://user:pw@store/d/shard-000000.tar?token=abc");
  const ShardFile files[] = {{shard, "shard-000000.tar", 12345, 7}};
  ASSERT_OK(fs->AttachShards(files));
  ASSERT_OK_AND_ASSIGN(auto shard_info, fs->Stat(shard));
  EXPECT_EQ(shard_info.size, 12345u);
  EXPECT_EQ(fs->DisplayName(url), "https://user:***@store/d/index.stoker?token=***");
  auto missing = fs->OpenForRead("https://user:pw@store/d/other.tar");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().message().find("pw@"), std::string::npos) << missing.error().message();
  EXPECT_FALSE(fs->CreateForWrite(url).ok());  // read-only
}

}  // namespace
}  // namespace stoker::remote
