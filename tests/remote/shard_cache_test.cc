#include "remote/shard_cache.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "core/cancel.h"
#include "core/hash.h"
#include "fake_clock.h"
#include "fault_file_system.h"
#include "remote/fake_transport.h"
#include "test_util.h"

namespace stoker::remote {
namespace {

using testing::FakeTransport;
using testing::Fault;
using testing::MakeFault;
using testing::Pattern;
using testing::StatusFault;

constexpr std::uint64_t kShard = 64 << 10;

// Free space as a test says (the real folder's otherwise).
class FreeSpaceFileSystem final : public ::stoker::testing::FaultFileSystem {};

struct CacheFixture {
  ::stoker::testing::TempDir dir;
  ::stoker::testing::FakeClock clock;  // backoff, refresh intervals and failure memory run on it
  FakeTransport transport;
  std::vector<ShardDesc> shards;
  std::vector<std::vector<std::byte>> data;

  explicit CacheFixture(int n) {
    for (int i = 0; i < n; ++i) {
      data.push_back(Pattern(kShard, static_cast<unsigned>(i + 10)));
      const std::string url = "http://store/d/shard-" + std::to_string(i) + ".tar";
      transport.Put(url, data.back());
      shards.push_back({url, "shard-" + std::to_string(i) + ".tar", kShard, Xxh3(data.back())});
    }
  }
  // `real_clock`: for tests of waits that must end in real time.
  // `fs`: where the cache keeps its copies.
  std::unique_ptr<ShardCache> Open(std::uint64_t capacity_shards, std::uint32_t connections = 4,
                                   bool real_clock = false, FileSystem* fs = FileSystem::Default()) {
    ShardCacheOptions o;
    o.cache.dir = dir.path();
    o.cache.capacity_bytes = capacity_shards * kShard;
    o.cache.min_free_bytes = 0;
    o.connections = connections;
    o.clock = real_clock ? nullptr : &clock;
    o.retry.clock = &clock;  // retries never wait really
    auto cache = ShardCache::Create(o, shards, &transport, fs);
    EXPECT_TRUE(cache.ok()) << cache.error().ToString();
    return std::move(cache).value();
  }
  // What the folder holds in entries now; the cache's threads may be
  // evicting one while this looks (then it no longer counts).
  std::uint64_t CachedBytes() const {
    std::uint64_t bytes = 0;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir.path(), ec)) {
      if (!IsCacheEntryName(e.path().filename().string())) continue;
      const std::uint64_t size = std::filesystem::file_size(e.path(), ec);
      if (!ec) bytes += size;
    }
    return bytes;
  }
  std::size_t Downloads(int shard) { return transport.requests(shards[shard].url).size(); }
};

Status ReadWhole(ShardCache& cache, std::uint32_t shard, std::vector<std::byte>& out) {
  out.resize(kShard);
  return cache.ReadAt(shard, 0, out);
}

TEST(ShardCache, ReadAheadFollowsThePlanWithinTheCapacityAndFetchesEachShardOnce) {
  CacheFixture f(12);
  auto cache = f.Open(/*capacity_shards=*/3);
  std::vector<std::uint32_t> plan(12);
  for (std::uint32_t i = 0; i < 12; ++i) plan[i] = i;
  const std::uint64_t base = cache->AppendPlan(plan);
  std::vector<std::byte> bytes;
  for (std::uint32_t i = 0; i < 12; ++i) {
    cache->AdvancePlan(base + i);
    ASSERT_TRUE(ReadWhole(*cache, i, bytes).ok());
    EXPECT_EQ(bytes, f.data[i]);
    EXPECT_LE(f.CachedBytes(), 3 * kShard);
  }
  for (int i = 0; i < 12; ++i) EXPECT_EQ(f.Downloads(i), 1u) << "shard " << i;
  const RemoteStats st = cache->stats();
  EXPECT_EQ(st.downloads, 12u);
  EXPECT_EQ(st.bytes_downloaded, 12 * kShard);
  EXPECT_EQ(st.over_capacity, 0u);
}

TEST(ShardCache, WithoutAPlanEvictionIsLeastRecentlyUsed) {
  CacheFixture f(3);
  auto cache = f.Open(/*capacity_shards=*/2, /*connections=*/1);
  std::vector<std::byte> bytes;
  for (std::uint32_t s : {0u, 1u, 0u, 2u, 0u}) ASSERT_TRUE(ReadWhole(*cache, s, bytes).ok());
  EXPECT_EQ(f.Downloads(0), 1u);  // kept: used more recently than shard 1
  EXPECT_EQ(f.Downloads(1), 1u);
  EXPECT_EQ(f.Downloads(2), 1u);
  EXPECT_FALSE(cache->IsLocal(1));
  EXPECT_TRUE(cache->IsLocal(0) && cache->IsLocal(2));
}

TEST(ShardCache, AMissEvictsTheShardNeededFurthestAhead) {
  CacheFixture f(3);
  auto cache = f.Open(/*capacity_shards=*/2, /*connections=*/1);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(ReadWhole(*cache, 0, bytes).ok());
  ASSERT_TRUE(ReadWhole(*cache, 1, bytes).ok());
  // Then 2, after which 1 is needed before 0: 0 must go, although 1 is
  // the least recently used.
  const std::uint32_t plan[] = {2, 1, 0};
  const std::uint64_t base = cache->AppendPlan(plan);
  cache->AdvancePlan(base);
  ASSERT_TRUE(ReadWhole(*cache, 2, bytes).ok());
  EXPECT_TRUE(cache->IsLocal(1));
  EXPECT_FALSE(cache->IsLocal(0));
}

TEST(ShardCache, ABodyThatFailsTheChecksumNeverBecomesAnEntry) {
  CacheFixture f(2);
  f.transport.AddFault(f.shards[0].url, MakeFault(Fault::Kind::kCorrupt, 100));
  f.transport.AddFault(f.shards[0].url, MakeFault(Fault::Kind::kCorrupt, 200));
  f.transport.AddFault(f.shards[1].url, MakeFault(Fault::Kind::kCorrupt, 300));  // once: retried
  auto cache = f.Open(4, 1);
  std::vector<std::byte> bytes;
  Status s = ReadWhole(*cache, 0, bytes);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find(f.shards[0].url), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("differs from the index"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(cache->EntryPath(0)));
  ASSERT_TRUE(ReadWhole(*cache, 1, bytes).ok());
  EXPECT_EQ(bytes, f.data[1]);
  for (const auto& e : std::filesystem::directory_iterator(f.dir.path()))
    EXPECT_FALSE(IsCachePartialName(e.path().filename().string())) << e.path();
}

TEST(ShardCache, EntriesSurviveTheProcessAndAreAdopted) {
  CacheFixture f(2);
  std::vector<std::byte> bytes;
  {
    auto cache = f.Open(4);
    ASSERT_TRUE(ReadWhole(*cache, 0, bytes).ok());
  }
  auto again = f.Open(4);
  ASSERT_TRUE(ReadWhole(*again, 0, bytes).ok());
  EXPECT_EQ(bytes, f.data[0]);
  EXPECT_EQ(f.Downloads(0), 1u);
}

TEST(ShardCache, TheFreeSpaceFloorStopsDownloadsWithAClearError) {
  CacheFixture f(1);
  ShardCacheOptions o;
  o.cache.dir = f.dir.path();
  o.cache.capacity_bytes = 4 * kShard;
  o.cache.min_free_bytes = 1 << 20;
  o.connections = 1;
  o.clock = &f.clock;
  FreeSpaceFileSystem fs;
  fs.free_bytes = std::uint64_t{100} << 10;
  auto cache = ShardCache::Create(o, f.shards, &f.transport, &fs);
  ASSERT_TRUE(cache.ok());
  std::vector<std::byte> bytes;
  Status s = ReadWhole(**cache, 0, bytes);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find(f.dir.path()), std::string::npos) << s.message();
  EXPECT_EQ(f.Downloads(0), 0u);
}

// The read-ahead advice (the loader's kernel_readahead) reaches the local
// copies open now and those opened later.
TEST(ShardCache, ReadAheadAdviceReachesEveryLocalCopy) {
  CacheFixture f(3);
  ::stoker::testing::FaultFileSystem fs;
  fs.record_advice = true;
  auto cache = f.Open(/*capacity_shards=*/3, /*connections=*/1, /*real_clock=*/false, &fs);
  std::vector<std::byte> bytes;
  ASSERT_TRUE(ReadWhole(*cache, 0, bytes).ok());
  EXPECT_TRUE(fs.Advised().empty());
  cache->AdviseAccess(AccessPattern::kRandom);
  ASSERT_TRUE(ReadWhole(*cache, 2, bytes).ok());
  EXPECT_EQ(bytes, f.data[2]);
  auto advised = fs.Advised();
  ASSERT_EQ(advised.size(), 2u);
  EXPECT_EQ(advised.at(cache->EntryPath(0)), AccessPattern::kRandom);
  EXPECT_EQ(advised.at(cache->EntryPath(2)), AccessPattern::kRandom);
  cache->AdviseAccess(AccessPattern::kNormal);
  for (const auto& [path, pattern] : fs.Advised()) EXPECT_EQ(pattern, AccessPattern::kNormal) << path;
}

TEST(ShardCache, CachesSharingAFolderHoldTheCapTogether) {
  CacheFixture f(8);
  auto a = f.Open(/*capacity_shards=*/3, 1);
  auto b = f.Open(/*capacity_shards=*/3, 1);
  std::vector<std::byte> bytes;
  // Two "ranks" reading different shards through one folder.
  for (std::uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(ReadWhole(*a, i, bytes).ok());
    EXPECT_EQ(bytes, f.data[i]);
    f.clock.AdvanceSeconds(0.25);  // past the refresh interval
    ASSERT_TRUE(ReadWhole(*b, 4 + i, bytes).ok());
    EXPECT_EQ(bytes, f.data[4 + i]);
    f.clock.AdvanceSeconds(0.25);
    EXPECT_LE(f.CachedBytes(), 3 * kShard) << "after round " << i;
  }
  // Each still reads what the other evicted, fetching it again.
  ASSERT_TRUE(ReadWhole(*b, 0, bytes).ok());
  EXPECT_EQ(bytes, f.data[0]);
}

TEST(ShardCache, AStoppingReaderAndAClosingCacheDoNotWaitForAStalledDownload) {
  CacheFixture f(2);
  f.transport.AddFault(f.shards[0].url, MakeFault(Fault::Kind::kStall));
  auto cache = f.Open(2, 2, /*real_clock=*/true);
  std::atomic<bool> reader_stopping{false};
  Status read_status;
  std::jthread reader([&] {
    const CancelScope scope(&reader_stopping);  // as the loader's workers do
    std::vector<std::byte> bytes(100);
    read_status = cache->ReadAt(0, 0, bytes);
  });
  while (f.Downloads(0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto t0 = std::chrono::steady_clock::now();
  reader_stopping = true;
  reader.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(read_status.code(), StatusCode::kCancelled) << read_status.ToString();
  EXPECT_NE(read_status.message().find(f.shards[0].url), std::string::npos);
  // Shard 1 is unaffected; closing abandons the stalled download of shard 0.
  std::vector<std::byte> bytes;
  ASSERT_TRUE(ReadWhole(*cache, 1, bytes).ok());
  EXPECT_EQ(bytes, f.data[1]);
  const auto t1 = std::chrono::steady_clock::now();
  cache.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));
  EXPECT_EQ(f.CachedBytes(), kShard);  // shard 1 only, and no partial file left
  for (const auto& e : std::filesystem::directory_iterator(f.dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".part-"), std::string::npos) << e.path();
}

TEST(ShardCache, AnotherLiveProcesssDownloadCountsAgainstTheCap) {
  CacheFixture f(4);
  // A partial file of a live process (pid 1 always is) for shard 3: its
  // download will need room too.
  const std::string other =
      f.dir.path() + "/" + std::filesystem::path(f.Open(4)->EntryPath(3)).filename().string() + ".part-1-0";
  { std::ofstream(other) << "partial"; }
  auto cache = f.Open(/*capacity_shards=*/3, 2);
  const std::uint32_t plan[] = {0, 1, 2};
  cache->AdvancePlan(cache->AppendPlan(plan));
  for (int i = 0; i < 500 && f.CachedBytes() < 2 * kShard; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  f.clock.AdvanceSeconds(2);  // read-ahead looks again now and then; still no room
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(f.CachedBytes(), 2 * kShard);  // read-ahead left room for the other download
  EXPECT_EQ(f.Downloads(2), 0u);
  // The other process finished elsewhere (its partial is gone): the folder
  // is looked at again within a second of the cache's time, and read-ahead
  // completes.
  std::filesystem::remove(other);
  f.clock.AdvanceSeconds(1.1);
  for (int i = 0; i < 500 && f.Downloads(2) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  EXPECT_EQ(f.Downloads(2), 1u);
  std::vector<std::byte> bytes;
  for (std::uint32_t s : {0u, 1u, 2u}) {
    ASSERT_TRUE(ReadWhole(*cache, s, bytes).ok());
    EXPECT_EQ(bytes, f.data[s]);
  }
  EXPECT_EQ(cache->stats().over_capacity, 0u);
}

// A shard whose download failed (a whole fetch cycle: every attempt) fails
// its readers at once for the rest of the epoch, instead of each read
// starting a new cycle; a new epoch (ResetPlan) or the failure memory's end
// tries again.
TEST(ShardCache, AFailedShardFailsItsReadersAtOnceUntilTheNextEpoch) {
  CacheFixture f(2);
  for (int i = 0; i < 100; ++i) f.transport.AddFault(f.shards[0].url, StatusFault(500));
  ShardCacheOptions o;
  o.cache.dir = f.dir.path();
  o.cache.capacity_bytes = 4 * kShard;
  o.cache.min_free_bytes = 0;
  o.connections = 2;
  o.clock = &f.clock;
  o.retry.clock = &f.clock;
  o.retry.max_attempts = 3;
  auto made = ShardCache::Create(o, f.shards, &f.transport, FileSystem::Default());
  ASSERT_TRUE(made.ok());
  auto& cache = **made;
  std::vector<std::byte> bytes;
  Status first = ReadWhole(cache, 0, bytes);
  EXPECT_EQ(first.code(), StatusCode::kUnavailable);
  EXPECT_NE(first.message().find("gave up after 3 attempts"), std::string::npos) << first.message();
  EXPECT_EQ(f.Downloads(0), 3u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ReadWhole(cache, 0, bytes).message(), first.message());
  EXPECT_EQ(f.Downloads(0), 3u);                 // no new requests
  ASSERT_TRUE(ReadWhole(cache, 1, bytes).ok());  // other shards are unaffected
  cache.ResetPlan();                             // a new epoch: one more cycle
  EXPECT_FALSE(ReadWhole(cache, 0, bytes).ok());
  EXPECT_EQ(f.Downloads(0), 6u);
  f.clock.AdvanceSeconds(61);  // the failure memory ends
  EXPECT_FALSE(ReadWhole(cache, 0, bytes).ok());
  EXPECT_EQ(f.Downloads(0), 9u);
}

TEST(ShardCache, ConcurrentReadersOfOneShardShareOneDownload) {
  CacheFixture f(1);
  auto cache = f.Open(2, 4);
  std::vector<std::jthread> readers;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    readers.emplace_back([&] {
      std::vector<std::byte> bytes(1000);
      if (cache->ReadAt(0, 5000, bytes).ok() && std::equal(bytes.begin(), bytes.end(), f.data[0].begin() + 5000)) ++ok;
    });
  readers.clear();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(f.Downloads(0), 1u);
}

}  // namespace
}  // namespace stoker::remote
