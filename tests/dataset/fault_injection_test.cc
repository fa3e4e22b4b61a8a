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
      WriteFile(root + "/class" + std::to_string(c) + "/" + std::to_string(i) + ".jpg", RandomBytes(2000, c * 50 + i));
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

// A pack's restart tables wait in a scratch file in its folder (blocks of
// 64 bytes here, so that every path is taken): read back whole, as often as
// asked; a full disk there is the pack's error; no scratch file means memory.
TEST(FaultInjection, RestartTablesWaitInAScratchFileThatAFullDiskStops) {
  TempDir dir;
  FaultFileSystem fs;
  std::string all;
  auto store = RestartStoreFor(fs, dir.path(), 64);
  EXPECT_EQ(fs.scratch_files(), 1);
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
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  fs.disk_full_for_path_part = "scratch";
  auto full = RestartStoreFor(fs, dir.path(), 64);
  Status s = full->Append(testing::Bytes(RandomBytes(100, 1)));
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(s.message().find("scratch"), std::string::npos) << s.message();

  // A seekable pack through it: the tables come back as packed; the same with no scratch file.
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
    EXPECT_EQ(fs.scratch_files(), before + (scratch ? 1 : 0));
    ASSERT_OK_AND_ASSIGN(auto dataset, Dataset::Open(out));
    EXPECT_EQ(dataset->seekable_payloads(), 6u);
    ASSERT_OK_AND_ASSIGN(auto report, Verify(*dataset));
    EXPECT_TRUE(report.ok());
  }
  EXPECT_EQ(testing::ReadFile(dir / "scratch/index.stoker"), testing::ReadFile(dir / "memory/index.stoker"));
}

}  // namespace
}  // namespace stoker
