// Faults injected through the FileSystem seam: nothing is lost, nothing
// half-written looks complete, and every error says what and where.
#include <filesystem>

#include <gtest/gtest.h>

#include "dataset/index_file.h"
#include "fault_file_system.h"
#include "pipeline/loader_test_util.h"
#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::FaultFileSystem;
using testing::RandomBytes;
using testing::TempDir;
using testing::WriteFile;

void MakeSource(const std::string& root) {
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 20; ++i)
      WriteFile(root + "/class" + std::to_string(c) + "/" + std::to_string(i) + ".jpg",
                testing::FakeImage("jpg", 2000, c * 50 + i));
}

std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  if (!std::filesystem::exists(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().filename().string());
  return out;
}

TEST(FaultInjection, DiskFullWhilePackingShards) {
  TempDir dir;
  MakeSource(dir / "src");
  FaultFileSystem fs;
  fs.disk_full_after = 50'000;
  PackOptions options;
  options.file_system = &fs;
  options.target_shard_bytes = 16384;
  auto r = Pack(dir / "src", dir / "out", options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.error().message().find("shard-0000"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("No space left on device"), std::string::npos) << r.error().message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker"));
  EXPECT_TRUE(Leftovers(dir / "out").empty());
  EXPECT_FALSE(Dataset::Open(dir / "out").ok());

  // The shards finished before the disk filled are removed too: a failed
  // pack leaves nothing of its own, so packing again needs no --force.
  for (const auto& entry : std::filesystem::directory_iterator(dir / "out"))
    ADD_FAILURE() << "left behind: " << entry.path();
  options.file_system = FileSystem::Default();
  ASSERT_OK_AND_ASSIGN(auto summary, Pack(dir / "src", dir / "out", options));
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out"));
  EXPECT_EQ(dataset->num_samples(), 60u);
  EXPECT_TRUE(Verify(*dataset)->ok());
}

TEST(FaultInjection, DiskFullWhileWritingTheIndex) {
  TempDir dir;
  MakeSource(dir / "src");
  FaultFileSystem fs;
  fs.disk_full_for_path_part = "index.stoker.tmp";
  PackOptions options;
  options.file_system = &fs;
  auto r = Pack(dir / "src", dir / "out", options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.error().message().find("index.stoker.tmp"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker"));
  EXPECT_TRUE(Leftovers(dir / "out").empty());
}

TEST(FaultInjection, FileVanishesAfterListing) {
  TempDir dir;
  MakeSource(dir / "src");
  FaultFileSystem fs;
  fs.vanished.insert(dir / "src/class1/13.jpg");
  PackOptions options;
  options.file_system = &fs;
  auto r = Pack(dir / "src", dir / "out", options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kNotFound);
  EXPECT_NE(r.error().message().find("sample 'class1/13'"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("class1/13.jpg"), std::string::npos) << r.error().message();
  EXPECT_FALSE(std::filesystem::exists(dir / "out/index.stoker"));
}

TEST(FaultInjection, ShortReadOfAShardIsCorruption) {
  TempDir dir;
  MakeSource(dir / "src");
  ASSERT_OK(Pack(dir / "src", dir / "out").status());
  FaultFileSystem fs;
  fs.short_reads_for_suffix = ".tar";
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out", &fs));
  auto r = dataset->ReadField(5, 1);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code(), StatusCode::kCorruption);
  EXPECT_NE(r.error().message().find("sample 'class0/13'"), std::string::npos) << r.error().message();
  EXPECT_NE(r.error().message().find("shard-000000.tar:"), std::string::npos) << r.error().message();
}

TEST(FaultInjection, VanishedShardIsReportedByVerify) {
  TempDir dir;
  MakeSource(dir / "src");
  ASSERT_OK(Pack(dir / "src", dir / "out").status());
  FaultFileSystem fs;
  fs.vanished.insert(dir / "out/shard-000000.tar");
  ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(dir / "out", &fs));
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_EQ(report.problems[0].where, "shard-000000.tar");
}

// A pack's records, keys and restart tables wait in scratch files in its
// folder (blocks of 64 bytes here, so that every path is taken): read back
// whole, as often as asked, or in part at any offset; a full disk there is
// the pack's error; no scratch file means memory.
TEST(FaultInjection, SamplesWaitInScratchFilesThatAFullDiskStops) {
  TempDir dir;
  FaultFileSystem fs;
  std::string all;
  auto stores = BuilderStoresFor(fs, dir.path(), 64);
  EXPECT_EQ(fs.scratch_files(), 3);
  auto& store = stores.records;
  for (int i = 0; i < 40; ++i) {
    const std::string piece = RandomBytes(static_cast<std::size_t>(i * 7 % 150), i);  // some longer than a block
    all += piece;
    ASSERT_TRUE(store->Append(testing::Bytes(piece)).ok());
  }
  EXPECT_EQ(store->size(), all.size());
  for (int pass = 0; pass < 2; ++pass) {
    std::vector<std::byte> back;
    index_format::VectorSink sink(back);
    ASSERT_TRUE(store->WriteTo(sink).ok());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(back.data()), back.size()), all) << "pass " << pass;
  }
  // Ranges in the file, in the block not yet written, and across the two.
  for (std::size_t at = 0; at < all.size(); at += 37) {
    const std::size_t n = std::min<std::size_t>(all.size() - at, 1 + at % 90);
    std::string part(n, '\0');
    ASSERT_OK(store->ReadAt(at, std::as_writable_bytes(std::span(part))));
    EXPECT_EQ(part, all.substr(at, n)) << "at " << at;
  }
  std::string past(2, '\0');
  EXPECT_EQ(store->ReadAt(all.size() - 1, std::as_writable_bytes(std::span(past))).code(), StatusCode::kInternal);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  fs.disk_full_for_path_part = "scratch";
  auto full = BuilderStoresFor(fs, dir.path(), 64);
  Status s = full.keys->Append(testing::Bytes(RandomBytes(100, 1)));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("scratch"), std::string::npos) << s.message();

  // A seekable pack through them: the samples and tables come back as packed; the same with no scratch file.
  fs.disk_full_for_path_part.clear();
  for (int i = 0; i < 6; ++i)
    WriteFile(dir / ("src/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".jpg"),
              MakeJpeg(256, 192, static_cast<unsigned>(i)));
  for (const bool scratch : {true, false}) {
    fs.no_scratch = !scratch;
    const int before = fs.scratch_files();
    PackOptions options;
    options.file_system = &fs;
    options.seekable_jpeg = true;
    const std::string out = dir / (scratch ? "scratch" : "memory");
    ASSERT_OK_AND_ASSIGN(auto summary, Pack(dir / "src", out, options));
    EXPECT_EQ(fs.scratch_files(), before + (scratch ? 3 : 0));
    ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(out));
    EXPECT_EQ(dataset->seekable_payloads(), 6u);
    ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
    EXPECT_TRUE(report.ok());
  }
  EXPECT_EQ(testing::ReadFile(dir / "scratch/index.stoker"), testing::ReadFile(dir / "memory/index.stoker"));
}

// The builder's samples read back from scratch files in blocks of 64 bytes
// (records cut anywhere between two reads) give the index it builds in
// memory, byte for byte; and every key reads back, long ones (past 16 bits
// of length) and across its every-64th-key offsets.
TEST(FaultInjection, AnIndexBuiltThroughSmallScratchBlocksIsTheOneBuiltInMemory) {
  TempDir dir;
  FaultFileSystem fs;
  index_format::IndexBuilder in_memory, in_scratch;
  in_scratch.SetStores(BuilderStoresFor(fs, dir.path(), 64));
  EXPECT_EQ(fs.scratch_files(), 3);
  std::vector<std::string> keys;
  std::vector<std::byte> payload(30);
  for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::byte>(i * 7);
  const std::vector<std::uint32_t> restarts = {0, 10, 20};
  for (index_format::IndexBuilder* b : {&in_memory, &in_scratch}) {
    std::uint32_t shard = 0;
    for (int i = 0; i < 300; ++i) {
      if (i % 100 == 0) shard = b->AddShard("shard-" + std::to_string(i / 100) + ".tar");
      const std::string key = i == 77 ? std::string(70'000, 'k')
                              : i == 78
                                  ? std::string(65'535, 'l')
                                  : "c" + std::to_string(i % 3) + "/" + std::string(i % 40, 'x') + std::to_string(i);
      if (b == &in_memory) keys.push_back(key);
      std::vector<index_format::IndexBuilder::Field> fields = {
          {"cls", std::uint64_t(i) * 1000, 3, index_format::kKindNotRecorded}};
      if (i % 3 != 0) fields.push_back({"txt", std::uint64_t(i) * 1000 + 512, std::uint64_t(i % 50)});
      if (i % 4 == 1) {
        index_format::IndexBuilder::Field jpeg{"jpg", std::uint64_t(i) * 1000 + 1024, payload.size()};
        jpeg.restarts = restarts;
        jpeg.geometry = {16, 16, 8};
        jpeg.payload = payload;
        fields.push_back(jpeg);
      }
      ASSERT_OK(b->AddSample(shard, key, i % 10, std::uint64_t(i) * 31, fields));
    }
  }
  ASSERT_OK_AND_ASSIGN(const std::vector<std::byte> a, in_memory.Finish());
  ASSERT_OK_AND_ASSIGN(const std::vector<std::byte> b, in_scratch.Finish());
  EXPECT_EQ(a, b);
  ASSERT_OK_AND_ASSIGN(auto view, index_format::IndexView::Open(a, "built"));
  EXPECT_EQ(view.num_samples(), 300u);
  for (std::uint64_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK_AND_ASSIGN(const std::string from_scratch, in_scratch.Key(i));
    ASSERT_OK_AND_ASSIGN(const std::string from_memory, in_memory.Key(i));
    ASSERT_EQ(from_scratch, keys[i]) << "sample " << i;
    ASSERT_EQ(from_memory, keys[i]) << "sample " << i;
  }
  EXPECT_EQ(in_scratch.Key(300).status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace stoker
