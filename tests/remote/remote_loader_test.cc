// The loader over a remote dataset whose cache is smaller than the data: with
// order=shard_block each shard is downloaded once per epoch (the cache
// downloads in the sampler's order and evicts what is needed furthest
// ahead). Served from memory by the fake transport with a latency per
// request, so readers catch up with downloads as they do over a network.
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "../pipeline/loader_test_util.h"
#include "fault_file_system.h"
#include "remote/fake_transport.h"
#include "remote/remote_file_system.h"
#include "stoker/open.h"

namespace stoker::remote {
namespace {

using testing::FakeTransport;
using testing::SharedTransport;

std::vector<std::byte> ReadBytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(text.size());
  std::memcpy(out.data(), text.data(), text.size());
  return out;
}

struct RemoteDataset {
  ::stoker::testing::TempDir dir;
  FakeTransport fake;
  std::vector<std::string> shard_urls;
  std::uint64_t dataset_bytes = 0;
  std::uint64_t largest_shard = 0;

  // `shards` shards of about `images_per_shard` images each.
  RemoteDataset(int shards, int images_per_shard) {
    std::uint64_t bytes = 0;
    const int images = shards * images_per_shard;
    for (int n = 0; n < images; ++n) {
      const std::string jpeg = MakeJpeg(40 + n % 13, 32 + n % 7, static_cast<unsigned>(n));
      ::stoker::testing::WriteFile(dir / ("src/c" + std::to_string(n % 5) + "/" + std::to_string(n) + ".jpg"), jpeg);
      bytes += jpeg.size() + 1536;  // with its tar headers (a member and its label)
    }
    PackOptions p;
    p.target_shard_bytes = bytes / shards;
    EXPECT_TRUE(Pack(dir / "src", dir / "out", p).ok());
    for (const auto& e : std::filesystem::directory_iterator(dir / "out")) {
      const std::string name = e.path().filename().string();
      fake.Put("http://store/d/" + name, ReadBytes(e.path()));
      if (name.ends_with(".tar")) {
        shard_urls.push_back("http://store/d/" + name);
        dataset_bytes += e.file_size();
        largest_shard = std::max<std::uint64_t>(largest_shard, e.file_size());
      }
    }
  }

  // `local`: where the cache keeps its copies.
  Result<std::shared_ptr<const Dataset>> Open(std::uint64_t cache_bytes, FileSystem* local = FileSystem::Default()) {
    RemoteOptions o;
    o.cache.dir = dir / "cache";
    o.cache.capacity_bytes = cache_bytes;
    o.cache.min_free_bytes = 0;
    o.connections = 4;
    auto fs = std::make_shared<RemoteFileSystem>(o, std::make_unique<SharedTransport>(&fake), local);
    STOKER_ASSIGN_OR_RETURN(auto dataset, Dataset::Open("http://store/d/index.stoker", fs));
    return std::shared_ptr<const Dataset>(std::move(dataset));
  }

  std::map<std::string, std::size_t> Downloads() {
    std::map<std::string, std::size_t> out;
    for (const auto& url : shard_urls) out[url] = fake.requests(url).size();
    return out;
  }
};

// A global shuffle through a cache that holds the dataset reads the cache's
// copies at random places: kernel_readahead reaches those files.
TEST(RemoteLoader, ReadAheadAdviceReachesTheCachesCopies) {
  RemoteDataset remote(4, 6);
  ::stoker::testing::FaultFileSystem local;
  local.record_advice = true;
  auto dataset = remote.Open(remote.dataset_bytes * 2, &local);
  ASSERT_TRUE(dataset.ok()) << dataset.error().ToString();
  LoaderOptions o = SmallOptions();
  o.kernel_readahead = KernelReadahead::kOff;
  auto loader = Loader::Create(*dataset, o);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  EXPECT_EQ((*loader)->stats().order, Order::kShuffle);
  EXPECT_FALSE((*loader)->stats().kernel_readahead);
  for (;;) {
    auto batch = (*loader)->Next();
    ASSERT_TRUE(batch.ok()) << batch.error().ToString();
    if (!*batch) break;
  }
  const auto advised = local.Advised();
  EXPECT_EQ(advised.size(), remote.shard_urls.size());
  for (const auto& [path, pattern] : advised) {
    EXPECT_EQ(pattern, AccessPattern::kRandom) << path;
    EXPECT_EQ(path.rfind(remote.dir / "cache", 0), 0u) << path;
  }
}

TEST(RemoteLoader, ShardBlockDownloadsEachShardOncePerEpochWithACacheOfAQuarter) {
  // Shards of about 24 images read in batches of 4: each spans six batches.
  RemoteDataset remote(/*shards=*/12, /*images_per_shard=*/24);
  ASSERT_GE(remote.shard_urls.size(), 11u);
  ASSERT_LE(remote.shard_urls.size(), 14u);
  remote.fake.SetLatency(std::chrono::milliseconds(5));
  auto dataset = remote.Open(remote.dataset_bytes / 4);
  ASSERT_TRUE(dataset.ok()) << dataset.error().ToString();
  LoaderOptions options = SmallOptions();
  options.order = Order::kShardBlockShuffle;
  options.threads = 2;
  auto loader = Loader::Create(*dataset, options);
  ASSERT_TRUE(loader.ok()) << loader.error().ToString();
  const std::size_t shards = remote.shard_urls.size();
  constexpr int kEpochs = 3;
  for (int e = 0; e < kEpochs; ++e) {
    (*loader)->SetEpoch(e);
    const Epoch epoch = RunEpoch(**loader);
    EXPECT_EQ(epoch.indices.size(), (*dataset)->num_samples());
  }
  // Once per epoch, and the next epoch's first shards fetched ahead at the
  // end of the last one: at most kEpochs + 1 per shard, and about kEpochs
  // times the dataset in all.
  std::size_t total = 0;
  for (const auto& [url, n] : remote.Downloads()) {
    EXPECT_LE(n, kEpochs + 1u) << url;
    total += n;
  }
  EXPECT_LE(total, kEpochs * shards + shards / 4 + 1);
  const RemoteStats st = GetRemoteStats(**dataset);
  EXPECT_EQ(st.over_capacity, 0u);
}

}  // namespace
}  // namespace stoker::remote
