// Megatron datasets behind http(s)/s3 URLs: the .idx fetched whole, the .bin
// read through the shard cache in chunks fetched by range, told ahead what
// the loader will read; the same tokens and batches as the local files, a
// cache smaller than the corpus included; truncation and servers without
// ranges named.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "remote/fake_transport.h"
#include "remote/remote_file_system.h"
#include "stoker/tokens.h"
#include "test_util.h"

namespace stoker {
namespace {

using remote::testing::FakeTransport;
using remote::testing::MakeFault;
using remote::testing::SharedTransport;
using stoker::testing::TempDir;

constexpr std::uint64_t kChunk = 64 << 10;

std::vector<std::byte> Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(v.size());
  std::memcpy(out.data(), v.data(), v.size());
  return out;
}

struct Corpus {
  TempDir local, cache;
  FakeTransport fake;
  std::vector<std::vector<std::int64_t>> docs;
  const std::string url = "http://store/lm/corpus";

  Corpus() {
    std::mt19937 rng(7);
    docs.resize(400);
    for (auto& d : docs) {
      d.resize(rng() % 1500);
      for (auto& t : d) t = static_cast<std::int64_t>(rng() % 50000);
    }
    auto writer = TokenDatasetWriter::Create(local / "corpus", "uint16");
    EXPECT_TRUE(writer.ok());
    for (const auto& d : docs) EXPECT_TRUE((*writer)->AddDocument(d).ok());
    EXPECT_TRUE((*writer)->Finish().ok());
    fake.Put(url + ".idx", Bytes(local / "corpus.idx"));
    fake.Put(url + ".bin", Bytes(local / "corpus.bin"));
  }
  std::uint64_t bin_size() { return Bytes(local / "corpus.bin").size(); }

  // A remote file system over the fake store, and the dataset on it.
  std::shared_ptr<const TokenDataset> Open(std::uint64_t capacity, std::shared_ptr<FileSystem>* keep) {
    RemoteOptions o;
    o.cache.dir = cache.path();
    o.cache.capacity_bytes = capacity;
    o.cache.min_free_bytes = 0;
    o.max_attempts = 2;
    o.backoff_initial_seconds = 0.001;
    *keep =
        std::make_shared<remote::RemoteFileSystem>(o, std::make_unique<SharedTransport>(&fake), FileSystem::Default());
    auto opened = TokenDataset::Open(url, keep->get(), kChunk);
    EXPECT_TRUE(opened.ok()) << opened.error().ToString();
    return opened.ok() ? std::shared_ptr<const TokenDataset>(std::move(opened).value()) : nullptr;
  }
};

std::vector<TokenBatch> TokenEpoch(std::shared_ptr<const TokenDataset> d, std::uint64_t epoch) {
  TokenLoaderOptions o;
  o.seq_len = 512;
  o.global_batch_size = 4;
  o.seed = 3;
  o.read_ahead_batches = 8;
  auto loader = TokenLoader::Create(std::move(d), o);
  EXPECT_TRUE(loader.ok()) << loader.error().ToString();
  EXPECT_TRUE((*loader)->SetEpoch(epoch).ok());
  std::vector<TokenBatch> out;
  for (;;) {
    auto next = (*loader)->Next(std::chrono::seconds(30));
    EXPECT_TRUE(next.ok()) << next.error().ToString();
    if (!next.ok() || !next->has_value()) break;
    out.push_back(std::move(**next));
  }
  return out;
}

void ExpectSameBatches(const std::vector<TokenBatch>& a, const std::vector<TokenBatch>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].input_ids, b[i].input_ids) << "batch " << i;
    EXPECT_EQ(a[i].labels, b[i].labels) << "batch " << i;
    EXPECT_EQ(a[i].cu_seqlens, b[i].cu_seqlens) << "batch " << i;
  }
}

TEST(RemoteTokenDataset, ReadsEveryTokenThroughRangedChunks) {
  Corpus c;
  std::shared_ptr<FileSystem> fs;
  auto d = c.Open(64 << 20, &fs);
  ASSERT_TRUE(d);
  EXPECT_TRUE(d->remote());
  ASSERT_EQ(d->num_documents(), c.docs.size());
  for (std::size_t i = 0; i < c.docs.size(); ++i) {
    std::vector<std::int64_t> out(c.docs[i].size());
    ASSERT_TRUE(d->ReadTokens(i, 0, out).ok());
    ASSERT_EQ(out, c.docs[i]) << "document " << i;
  }
  // Every chunk fetched once, by a range of exactly its bytes.
  const std::uint64_t size = c.bin_size(), chunks = (size + kChunk - 1) / kChunk;
  const auto requests = c.fake.requests(c.url + ".bin");
  ASSERT_EQ(requests.size(), chunks);
  std::set<std::uint64_t> starts;
  for (const auto& r : requests) {
    ASSERT_TRUE(r.range_start && r.range_end);
    EXPECT_EQ(*r.range_start % kChunk, 0u);
    EXPECT_EQ(*r.range_end, std::min(*r.range_start + kChunk, size) - 1);
    starts.insert(*r.range_start);
  }
  EXPECT_EQ(starts.size(), chunks);
  EXPECT_EQ(d->remote_stats().downloads, chunks);
}

TEST(RemoteTokenDataset, TheLoaderGivesTheLocalBatchesWithACacheSmallerThanTheCorpus) {
  Corpus c;
  auto local = TokenDataset::Open(c.local / "corpus");
  ASSERT_TRUE(local.ok());
  std::shared_ptr<const TokenDataset> here = std::move(local).value();
  std::shared_ptr<FileSystem> fs;
  auto d = c.Open(/*capacity=*/3 * kChunk, &fs);  // a third of the corpus or less
  ASSERT_TRUE(d);
  ASSERT_GT(c.bin_size(), 6 * kChunk);
  for (std::uint64_t epoch : {0, 1}) ExpectSameBatches(TokenEpoch(d, epoch), TokenEpoch(here, epoch));
  const RemoteStats stats = d->remote_stats();
  EXPECT_GT(stats.evictions, 0u);
  EXPECT_GT(stats.hits, 0u);  // read ahead of the reader
}

TEST(RemoteTokenDataset, ATruncatedBinAndAServerWithoutRangesAreNamed) {
  Corpus c;
  auto bin = Bytes(c.local / "corpus.bin");
  bin.resize(bin.size() - 100);
  c.fake.Put(c.url + ".bin", bin);
  std::shared_ptr<FileSystem> fs;
  auto d = c.Open(64 << 20, &fs);
  ASSERT_TRUE(d);  // the .bin is not fetched at open
  const std::uint64_t last = c.docs.size() - 1;
  ASSERT_GT(c.docs[last].size(), 60u);
  std::vector<std::int64_t> out(c.docs[last].size());
  Status s = d->ReadTokens(last, 0, out);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("http://store/lm/corpus.bin"), std::string::npos) << s.ToString();

  Corpus plain;
  plain.fake.AddFault(plain.url + ".bin", MakeFault(remote::testing::Fault::Kind::kIgnoreRange));
  std::shared_ptr<FileSystem> fs2;
  auto e = plain.Open(64 << 20, &fs2);
  ASSERT_TRUE(e);
  std::vector<std::int64_t> first(plain.docs[0].size());
  s = e->ReadTokens(0, 0, first);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ignores Range requests"), std::string::npos) << s.ToString();
}

TEST(RemoteTokenDataset, ABadIndexIsNamedByItsUrl) {
  Corpus c;
  auto idx = Bytes(c.local / "corpus.idx");
  idx[9] = std::byte{7};  // version 7
  c.fake.Put(c.url + ".idx", idx);
  RemoteOptions o;
  o.cache.dir = c.cache.path();
  o.cache.min_free_bytes = 0;
  auto fs =
      std::make_shared<remote::RemoteFileSystem>(o, std::make_unique<SharedTransport>(&c.fake), FileSystem::Default());
  auto opened = TokenDataset::Open(c.url, fs.get(), kChunk);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().code(), StatusCode::kUnimplemented) << opened.error().ToString();
  EXPECT_NE(opened.error().message().find("http://store/lm/corpus.idx: Megatron index version 7"), std::string::npos)
      << opened.error().ToString();
  idx[0] = std::byte{'X'};
  c.fake.Put("http://store/lm/other.idx", idx);
  opened = TokenDataset::Open("http://store/lm/other", fs.get(), kChunk);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.error().code(), StatusCode::kCorruption) << opened.error().ToString();
  EXPECT_NE(opened.error().message().find("http://store/lm/other.idx: neither a stoker index nor a Megatron .idx"),
            std::string::npos)
      << opened.error().ToString();
}

}  // namespace
}  // namespace stoker
