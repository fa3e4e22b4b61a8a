// Batched reads: neighbouring fields merged into one request, every request
// submitted together (io_uring, or pread), the same bytes as one-by-one
// reads, and failures confined to the fields really affected.
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "pipeline/loader_test_util.h"
#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::RandomBytes;
using testing::TempDir;
using testing::WriteFile;

// 3 classes x 20 samples of 3000 bytes (a JPEG header, then random), in shards of about 20 KB.
std::unique_ptr<Dataset> MakeDataset(const TempDir& dir, FileSystem* fs = FileSystem::Default()) {
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 20; ++i)
      WriteFile(dir / ("src/class" + std::to_string(c) + "/" + std::to_string(i) + ".jpg"),
                testing::FakeImage("jpg", 3000, c * 50 + i));
  PackOptions options;
  options.target_shard_bytes = 20000;
  EXPECT_TRUE(Pack(dir / "src", dir / "out", options).ok());
  auto dataset = Dataset::Open(dir / "out", fs);
  EXPECT_TRUE(dataset.ok());
  return std::move(*dataset);
}

struct Batch {
  std::vector<SampleInfo> infos;
  std::vector<Dataset::FieldRead> reads;
};

Batch Prepare(const Dataset& d, const std::vector<std::uint64_t>& samples) {
  Batch b;
  const std::size_t jpg = *d.FieldIndex("jpg");
  for (auto s : samples) b.infos.push_back(*d.Sample(s));
  for (const auto& info : b.infos) b.reads.push_back({&info, jpg, {}, Status::Ok(), true, std::nullopt, {}});
  return b;
}

TEST(ReadFields, MergesNeighboursAndMatchesSingleReads) {
  TempDir dir;
  auto d = MakeDataset(dir);
  ASSERT_GT(d->shards().size(), 3u);
  const std::size_t jpg = *d->FieldIndex("jpg");

  // Consecutive samples of one shard: one request.
  const auto first = d->shards()[1].first_sample;
  Batch sequential = Prepare(*d, {first + 2, first, first + 1, first + 3});
  std::vector<std::byte> arena;
  EXPECT_EQ(d->ReadFields(sequential.reads, arena), 1u);
  for (const auto& r : sequential.reads) {
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    auto alone = d->ReadField(r.sample->index, jpg);
    ASSERT_TRUE(alone.ok());
    EXPECT_TRUE(std::equal(r.bytes.begin(), r.bytes.end(), alone->begin(), alone->end())) << r.sample->key;
  }

  // Samples spread over shards: one request per shard run; with no gap
  // allowed, one per sample (checking reads each sample's .cls beside its
  // .jpg, which merging takes in the same request; not checking here, so
  // that each sample is one field).
  Batch spread = Prepare(*d, {0, 1, 59, 30, 31, 58});
  EXPECT_EQ(d->ReadFields(spread.reads, arena), 3u);
  Dataset::ReadFieldsOptions no_merging;
  no_merging.max_gap = 0;
  no_merging.verify = false;
  EXPECT_EQ(d->ReadFields(spread.reads, arena, no_merging), 6u);
  Dataset::ReadFieldsOptions small_requests;
  small_requests.max_request = 4000;  // one field each
  small_requests.verify = false;
  EXPECT_EQ(d->ReadFields(sequential.reads, arena, small_requests), 4u);
  for (const auto& r : spread.reads) {
    ASSERT_TRUE(r.status.ok());
    EXPECT_EQ(r.bytes.size(), 3000u);
  }
}

TEST(ReadFields, ThePreadPathReadsTheSameBytes) {
  TempDir dir;
  auto d = MakeDataset(dir);
  Batch batch = Prepare(*d, {0, 1, 2, 40, 41, 20});
  std::vector<std::byte> arena_default, arena_pread;
  (void)d->ReadFields(batch.reads, arena_default);
  std::string method;
  // A thread that starts reading with io_uring disabled uses pread.
  ::setenv("STOKER_DISABLE_IO_URING", "1", 1);
  std::thread([&] {
    Batch again = Prepare(*d, {0, 1, 2, 40, 41, 20});
    (void)d->ReadFields(again.reads, arena_pread);
    method = d->file_system()->ReadBatchMethod();
    for (const auto& r : again.reads) EXPECT_TRUE(r.status.ok());
  }).join();
  ::unsetenv("STOKER_DISABLE_IO_URING");
  EXPECT_EQ(method, "pread");
  EXPECT_EQ(arena_default, arena_pread);
  const std::string here = d->file_system()->ReadBatchMethod();
  EXPECT_TRUE(here == "io_uring" || here == "pread") << here;  // pread where the kernel refuses io_uring
}

TEST(ReadFields, ATruncatedShardFailsOnlyTheFieldsPastItsEnd) {
  TempDir dir;
  auto d = MakeDataset(dir);
  const ShardInfo shard = d->shards()[0];
  std::vector<std::uint64_t> samples;
  for (std::uint64_t s = shard.first_sample; s < shard.first_sample + shard.num_samples; ++s) samples.push_back(s);
  Batch batch = Prepare(*d, samples);
  const auto last_offset = batch.infos.back().fields[*d->FieldIndex("jpg")]->offset;
  std::filesystem::resize_file(shard.full_path, last_offset + 100);  // the last sample loses its tail
  auto reopened = Dataset::Open(dir / "out");
  ASSERT_TRUE(reopened.ok());
  Batch again = Prepare(**reopened, samples);
  std::vector<std::byte> arena;
  (void)(*reopened)->ReadFields(again.reads, arena);
  for (std::size_t i = 0; i + 1 < again.reads.size(); ++i) EXPECT_TRUE(again.reads[i].status.ok()) << i;
  const Status& last = again.reads.back().status;
  ASSERT_FALSE(last.ok());
  EXPECT_EQ(last.code(), StatusCode::kCorruption);
  EXPECT_NE(last.message().find("sample '" + std::string(again.infos.back().key) + "'"), std::string::npos)
      << last.message();
  EXPECT_NE(last.message().find("shard-000000.tar:" + std::to_string(last_offset)), std::string::npos)
      << last.message();
}

TEST(ReadFields, FaultyFileSystemsGoThroughTheDefaultPath) {
  TempDir dir;
  testing::FaultFileSystem fs;
  auto d = MakeDataset(dir, &fs);
  fs.short_reads_for_suffix = ".tar";
  Batch batch = Prepare(*d, {0, 1});
  std::vector<std::byte> arena;
  (void)d->ReadFields(batch.reads, arena);
  for (const auto& r : batch.reads) {
    ASSERT_FALSE(r.status.ok());
    EXPECT_EQ(r.status.code(), StatusCode::kCorruption);
  }
}

// Every request a dataset's batched reads make, by shard path.
class RecordingFileSystem : public testing::FaultFileSystem {
 public:
  struct Read {
    std::string path;
    std::uint64_t offset, size;
  };
  void ReadBatch(std::span<ReadRequest> requests) override {
    {
      std::lock_guard lock(mu_);
      for (const auto& r : requests) reads_.push_back({r.file->path(), r.offset, r.out.size()});
    }
    FaultFileSystem::ReadBatch(requests);
  }
  std::vector<Read> Take() {
    std::lock_guard lock(mu_);
    return std::exchange(reads_, {});
  }

 private:
  std::mutex mu_;
  std::vector<Read> reads_;
};

// A seekable JPEG read in part (read_crop_rows): its head and MCU rows
// [first, end) only, no request spanning the rows left out, every piece
// checked against the index's region record; damage in the rows read is
// named, damage in the rows left out is not read.
TEST(ReadFields, AJpegReadInPartReadsOnlyItsHeadAndRowsAndChecksThem) {
  TempDir dir;
  for (int i = 0; i < 6; ++i)
    WriteFile(dir / ("src/c" + std::to_string(i % 2) + "/" + std::to_string(i) + ".jpg"),
              MakeJpeg(256, 192, static_cast<unsigned>(i)));  // 4:2:0: 12 MCU rows of 16 px
  PackOptions p;
  p.seekable_jpeg = true;
  ASSERT_TRUE(Pack(dir / "src", dir / "out", p).ok());
  RecordingFileSystem fs;
  auto opened = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  auto& d = **opened;
  ASSERT_TRUE(d.has_region_records());
  const std::size_t jpg = *d.FieldIndex("jpg");
  auto info = *d.Sample(3);
  std::vector<std::uint32_t> table;
  RegionRecord region;
  ASSERT_TRUE(d.RestartTable(3, jpg, table, &region));
  ASSERT_EQ(region.rows(), 12u);
  EXPECT_EQ(region.geometry.width, 256u);
  EXPECT_EQ(region.geometry.height, 192u);
  EXPECT_EQ(region.geometry.mcu_height, 16u);
  const auto whole = *d.ReadField(3, jpg);
  const FieldLocation loc = *info.fields[jpg];
  EXPECT_TRUE(d.CheckRegionRecord(info, jpg, whole).ok());

  auto read_part = [&](std::uint32_t first, std::uint32_t end, bool verify) {
    Dataset::FieldRead read;
    read.sample = &info;
    read.field = jpg;
    read.part = Dataset::FieldRead::Part{&table, &region, first, end};
    std::vector<std::byte> arena;
    Dataset::ReadFieldsOptions options;
    options.verify = verify;
    (void)fs.Take();
    (void)d.ReadFields(std::span(&read, 1), arena, options);
    return std::make_pair(read, std::move(arena));
  };
  for (bool verify : {false, true}) {
    auto [read, arena] = read_part(3, 7, verify);
    ASSERT_TRUE(read.status.ok()) << read.status.ToString();
    ASSERT_TRUE(read.part.has_value());
    const std::uint64_t begin = region.RowStart(table, 3, loc.size), end = region.RowStart(table, 7, loc.size);
    EXPECT_TRUE(std::equal(read.bytes.begin(), read.bytes.end(), whole.begin(), whole.begin() + table[0]));
    EXPECT_TRUE(std::equal(read.rows.begin(), read.rows.end(), whole.begin() + static_cast<std::ptrdiff_t>(begin),
                           whole.begin() + static_cast<std::ptrdiff_t>(end)));
    // No request touches the rows left out: [table[0], begin) and [end, size).
    for (const auto& r : fs.Take()) {
      const std::uint64_t lo = r.offset, hi = r.offset + r.size;
      EXPECT_FALSE(lo < loc.offset + begin && hi > loc.offset + table[0]) << lo << "-" << hi;
      EXPECT_FALSE(lo < loc.offset + loc.size && hi > loc.offset + end) << lo << "-" << hi;
    }
  }
  // A part past the rows is read whole.
  auto [past, past_arena] = read_part(10, 13, true);
  ASSERT_TRUE(past.status.ok());
  EXPECT_FALSE(past.part.has_value());
  EXPECT_TRUE(past.rows.empty());
  EXPECT_TRUE(std::equal(past.bytes.begin(), past.bytes.end(), whole.begin(), whole.end()));

  // A byte changed in row 5 of the shard: reading rows 3-6 with a check names it; rows 8-11 do not read it.
  const std::uint64_t damaged_at = loc.offset + region.RowStart(table, 5, loc.size) + 7;
  {
    std::fstream f(d.shards()[info.shard].full_path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(damaged_at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(damaged_at));
    f.write(&c, 1);
  }
  auto [bad, bad_arena] = read_part(3, 7, true);
  ASSERT_FALSE(bad.status.ok());
  EXPECT_EQ(bad.status.code(), StatusCode::kCorruption);
  EXPECT_TRUE(bad.pieces_disagree);
  EXPECT_NE(bad.status.message().find("sample '" + std::string(info.key) + "'"), std::string::npos)
      << bad.status.message();
  EXPECT_NE(bad.status.message().find("MCU rows 3-6"), std::string::npos) << bad.status.message();
  auto [unread, unread_arena] = read_part(8, 12, true);
  EXPECT_TRUE(unread.status.ok()) << unread.status.ToString();
  auto [unchecked, unchecked_arena] = read_part(3, 7, false);
  EXPECT_TRUE(unchecked.status.ok());
  EXPECT_FALSE(d.ReadField(3, jpg).ok()) << "a whole read checks the sample's checksum";
  // `stoker verify --decode` checks every record against the bytes.
  const auto damaged = *d.ReadField(3, jpg, /*verify=*/false);
  const Status mismatch = d.CheckRegionRecord(info, jpg, damaged);
  EXPECT_EQ(mismatch.code(), StatusCode::kCorruption);
  EXPECT_NE(mismatch.message().find("region record"), std::string::npos) << mismatch.message();
}

}  // namespace
}  // namespace stoker
