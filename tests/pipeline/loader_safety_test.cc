// The loader against misuse and bad data: concurrent iteration, limits,
// fork, timeouts, silently wrong bytes (checked on read), decompression
// bombs, extreme downscaling, images stoker cannot decode, exact counts.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "fault_file_system.h"
#include "format/index_format.h"
#include "pipeline/loader_test_util.h"

namespace stoker {
namespace {

// Overwrites `bytes` at `offset` of `path` (a shard or an index).
void Patch(const std::string& path, std::uint64_t offset, std::string_view bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string ReadAt(const std::string& path, std::uint64_t offset, std::size_t n) {
  std::ifstream f(path, std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  std::string out(n, '\0');
  f.read(out.data(), static_cast<std::streamsize>(n));
  return out;
}

// Every batch of one epoch, whatever comes first.
Status Consume(Loader& loader, std::size_t* batches = nullptr) {
  while (true) {
    auto next = loader.Next();
    if (!next.ok()) return next.error();
    if (!next->has_value()) return Status::Ok();
    if (batches) ++*batches;
  }
}

TEST(LoaderSafety, TwoThreadsIteratingOneLoaderEachGetDistinctBatches) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto o = SmallOptions();
  o.threads = 3;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  for (std::uint64_t round = 0; round < 20; ++round) {
    std::mutex mu;
    std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;  // (epoch, batch)
    std::atomic<int> errors{0};
    auto consume = [&] {
      while (true) {
        auto next = (*loader)->Next();
        if (!next.ok()) {
          ++errors;
          return;
        }
        if (!next->has_value()) return;
        std::lock_guard lock(mu);
        seen.emplace_back((**next).epoch(), (**next).batch_index());
      }
    };
    { std::jthread a(consume), b(consume); }
    EXPECT_EQ(errors.load(), 0);
    // One of the two ended the epoch; the other may have gone on into the
    // next. Each batch went to exactly one of them.
    std::set<std::pair<std::uint64_t, std::uint64_t>> unique(seen.begin(), seen.end());
    EXPECT_EQ(unique.size(), seen.size()) << "a batch was delivered twice in round " << round;
    const auto this_epoch = std::count_if(seen.begin(), seen.end(), [&](const auto& p) { return p.first == round; });
    EXPECT_EQ(static_cast<std::uint64_t>(this_epoch), (*loader)->batches_per_epoch()) << "round " << round;
    (*loader)->SetEpoch(round + 1);
  }
}

TEST(LoaderSafety, LimitsAndRanksAreCheckedWithMessagesNamingTheOption) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto expect_error = [&](LoaderOptions o, std::string_view says) {
    auto r = Loader::Create(dataset, o);
    ASSERT_FALSE(r.ok()) << says;
    EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.error().message().find(says), std::string::npos) << r.error().message();
  };
  auto o = SmallOptions();
  o.threads = 100000;
  expect_error(o, "threads 100000 is more than the limit 1024");
  o = SmallOptions();
  o.prefetch = 10000;
  expect_error(o, "prefetch 10000 is more than the limit 64");
  o = SmallOptions();
  o.world_size = 0;
  expect_error(o, "world_size 0 must be positive");
  o = SmallOptions();
  o.rank = -5;
  expect_error(o, "rank -5 must be non-negative");
  o = SmallOptions();
  o.transform.mean[1] = std::nanf("");
  expect_error(o, "normalize mean[1] = nan is not a finite number");
  o = SmallOptions();
  o.transform.std[2] = -1;
  expect_error(o, "normalize std[2] = -1 must be a positive finite number");
  o = SmallOptions();
  o.transform.flip_probability = 2;
  expect_error(o, "flip probability 2 is not in [0, 1]");
}

TEST(LoaderSafety, NextWithATimeoutSaysSoAndLosesNothing) {
  TempDir dir;
  MakeDataset(dir);
  // Reads are held until the first timeout has been seen, so that one is
  // certain however the threads are scheduled.
  testing::FaultFileSystem fs;
  fs.reads_held = true;
  auto opened = Dataset::Open(dir / "out", &fs);
  ASSERT_TRUE(opened.ok()) << opened.error().ToString();
  std::shared_ptr<const Dataset> dataset(std::move(opened).value());
  auto o = SmallOptions();
  o.threads = 1;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  std::size_t batches = 0;
  int timeouts = 0;
  while (true) {
    auto next = (*loader)->Next(std::chrono::nanoseconds(1));
    if (!next.ok()) {
      ASSERT_EQ(next.error().code(), StatusCode::kDeadlineExceeded) << next.error().ToString();
      ++timeouts;
      fs.ReleaseReads();
      continue;
    }
    if (!next->has_value()) break;
    ++batches;
  }
  EXPECT_EQ(batches, (*loader)->batches_per_epoch());
  EXPECT_GT(timeouts, 0);
}

TEST(LoaderSafety, AForkedChildIsToldItCannotUseItsParentsLoader) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support forking a process with threads; runs in the other builds";
#endif
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto loader = Loader::Create(dataset, SmallOptions());
  ASSERT_TRUE(loader.ok());
  const pid_t child = ::fork();
  if (child == 0) {
    auto next = (*loader)->Next();
    const bool refused = !next.ok() && next.error().code() == StatusCode::kFailedPrecondition &&
                         next.error().message().find("forked child") != std::string::npos;
    loader->reset();  // the destructor must not wait for threads the child does not have
    ::_exit(refused ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung or crashed";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(Consume(**loader).ok());  // the parent's loader is unaffected
}

TEST(LoaderSafety, CorruptSkippedCountsEachReplacedPlaceOnceAndOnlyDeliveredOnes) {
  TempDir dir;
  auto dataset = MakeDataset(dir, /*with_corrupt=*/true);
  auto o = SmallOptions();
  o.on_corrupt = CorruptPolicy::kSkip;
  o.prefetch = 6;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
    (*loader)->SetEpoch(epoch);
    const auto before = (*loader)->stats();
    ASSERT_TRUE(Consume(**loader).ok());
    EXPECT_EQ((*loader)->stats().Since(before).corrupt_skipped, 1u) << "epoch " << epoch;
  }
  // Batches prepared ahead and thrown away by SetEpoch are not counted.
  (*loader)->SetEpoch(10);
  (*loader)->SetEpoch(11);
  EXPECT_EQ((*loader)->stats().corrupt_skipped, 3u);
}

// A byte flipped in a sample's JPEG payload decodes to other pixels without
// any error from libjpeg; the checksum on read catches it.
TEST(LoaderSafety, AFlippedByteInAShardIsCaughtOnRead) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto info = dataset->Sample(7);
  ASSERT_TRUE(info.ok());
  const std::size_t jpg = *dataset->FieldIndex("jpg");
  const auto& loc = *info->fields[jpg];
  const std::string shard = dataset->shards()[info->shard].full_path;
  const std::uint64_t at = loc.offset + loc.size / 2;
  std::string byte = ReadAt(shard, at, 1);
  byte[0] = static_cast<char>(byte[0] ^ 0x01);
  Patch(shard, at, byte);
  auto o = SmallOptions();
  o.shuffle = false;
  auto loader = Loader::Create(dataset, o);
  ASSERT_TRUE(loader.ok());
  Status s = Consume(**loader);
  ASSERT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("sample checksum mismatch"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("sample '" + std::string(info->key) + "'"), std::string::npos) << s.message();
  // Checking can be turned off (and then the flip goes unnoticed).
  o.verify_samples = false;
  auto unchecked = Loader::Create(dataset, o);
  ASSERT_TRUE(unchecked.ok());
  EXPECT_TRUE(Consume(**unchecked).ok());
}

TEST(LoaderSafety, AMissingOrTruncatedShardFailsTheLoadersCreationNotAnEpoch) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  ASSERT_GE(dataset->shards().size(), 2u);
  const ShardInfo& last = dataset->shards().back();
  std::filesystem::resize_file(last.full_path, last.size / 2);
  auto o = SmallOptions();
  auto truncated = Loader::Create(dataset, o);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.error().code(), StatusCode::kCorruption);
  EXPECT_NE(truncated.error().message().find("'" + last.path + "' is "), std::string::npos)
      << truncated.error().message();
  // With on_corrupt skip the loader starts, and the samples past the shard's new end are skipped and counted.
  o.on_corrupt = CorruptPolicy::kSkip;
  auto skipping = Loader::Create(dataset, o);
  ASSERT_TRUE(skipping.ok()) << skipping.error().message();
  EXPECT_TRUE(Consume(**skipping).ok());
  EXPECT_GT((*skipping)->stats().corrupt_skipped, 0u);
  std::filesystem::remove(last.full_path);  // missing: refused under either policy
  auto missing = Loader::Create(dataset, o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.error().message().find("'" + last.path + "' (stat"), std::string::npos)
      << missing.error().message();
}

// A label flipped in the index is checked against the sample's .cls.
TEST(LoaderSafety, AFlippedLabelInTheIndexIsCaughtOnRead) {
  TempDir dir;
  auto dataset = MakeDataset(dir);
  auto info = dataset->Sample(4);
  ASSERT_TRUE(info.ok());
  const std::string index = dir / "out/index.stoker";
  const std::string header = ReadAt(index, 0, index_format::kHeaderSize);
  const auto records = index_format::Load<std::uint64_t>(reinterpret_cast<const std::byte*>(header.data()) +
                                                         index_format::header::kRecordsOff);
  const auto record_size = index_format::Load<std::uint32_t>(reinterpret_cast<const std::byte*>(header.data()) +
                                                             index_format::header::kRecordSizeOff);
  const std::int64_t wrong = info->label + 1;
  Patch(index, records + 4 * record_size + 16, std::string_view(reinterpret_cast<const char*>(&wrong), 8));
  auto reopened = Dataset::Open(dir / "out");
  ASSERT_TRUE(reopened.ok());
  std::shared_ptr<const Dataset> d = std::move(reopened).value();
  auto o = SmallOptions();
  o.shuffle = false;
  auto loader = Loader::Create(d, o);
  ASSERT_TRUE(loader.ok());
  Status s = Consume(**loader);
  ASSERT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("label " + std::to_string(wrong) + " differs from the shard's .cls (" +
                             std::to_string(info->label) + ")"),
            std::string::npos)
      << s.message();
  // `verify` names it too.
  auto report = Verify(*d);
  ASSERT_TRUE(report.ok());
  bool named = false;
  for (const auto& p : report->problems) named |= p.message.find("differs from the shard's .cls") != std::string::npos;
  EXPECT_TRUE(named);
}

TEST(LoaderSafety, AnImageAboveThePixelLimitIsRefusedBeforeDecodingAndSkippable) {
  TempDir dir;
  WriteFile(dir / "src/a/big.jpg", MakeJpeg(3000, 2000, 1));
  for (int i = 0; i < 3; ++i) WriteFile(dir / ("src/a/" + std::to_string(i) + ".jpg"), MakeJpeg(64, 48, 2 + i));
  ASSERT_TRUE(Pack(dir / "src", dir / "out").ok());
  std::shared_ptr<const Dataset> d = std::move(Dataset::Open(dir / "out")).value();
  auto o = SmallOptions();
  o.transform.max_pixels = 1'000'000;
  auto loader = Loader::Create(d, o);
  ASSERT_TRUE(loader.ok());
  Status s = Consume(**loader);
  ASSERT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("image is 3000x2000 = 6.0 megapixels, more than the limit of 1.0"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("sample 'a/big'"), std::string::npos) << s.message();
  o.on_corrupt = CorruptPolicy::kSkip;
  auto skipping = Loader::Create(d, o);
  ASSERT_TRUE(skipping.ok());
  EXPECT_TRUE(Consume(**skipping).ok());
  EXPECT_EQ((*skipping)->stats().corrupt_skipped, 1u);
  o.transform.max_pixels = 0;  // no limit: the genuine image decodes
  auto unlimited = Loader::Create(d, o);
  ASSERT_TRUE(unlimited.ok());
  EXPECT_TRUE(Consume(**unlimited).ok());
  EXPECT_EQ((*unlimited)->stats().corrupt_skipped, 0u);
}

// Downscaling far beyond 32x after DCT scaling (a whole image to one
// pixel) is ordinary work, never an internal error.
TEST(LoaderSafety, ExtremeDownscalingWorks) {
  TempDir dir;
  WriteFile(dir / "src/a/wide.jpg", MakeJpeg(2400, 40, 3));
  WriteFile(dir / "src/a/tall.jpg", MakeJpeg(40, 1800, 4));
  ASSERT_TRUE(Pack(dir / "src", dir / "out").ok());
  std::shared_ptr<const Dataset> d = std::move(Dataset::Open(dir / "out")).value();
  for (auto kind : {TransformOptions::Kind::kRandomResizedCrop, TransformOptions::Kind::kResizeCenterCrop}) {
    auto o = SmallOptions();
    o.batch_size = 2;
    o.transform.kind = kind;
    o.transform.width = o.transform.height = 1;
    o.transform.resize = 1;
    o.transform.ratio = {0.01, 100};
    auto loader = Loader::Create(d, o);
    ASSERT_TRUE(loader.ok()) << loader.error().ToString();
    Status s = Consume(**loader);
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
}

TEST(LoaderSafety, ADamagedBmpInAnImageFolderIsCorruptionNamingTheSample) {
  TempDir dir;
  for (int i = 0; i < 3; ++i) WriteFile(dir / ("src/a/" + std::to_string(i) + ".jpg"), MakeJpeg(64, 48, 7 + i));
  WriteFile(dir / "src/a/pic.bmp", std::string("BM") + std::string(100, 'b'));
  auto refused = Pack(dir / "src", dir / "out");  // pack reads the header too
  ASSERT_EQ(refused.error().code(), StatusCode::kCorruption);
  EXPECT_NE(refused.error().message().find("sample 'a/pic'"), std::string::npos) << refused.error().ToString();
  PackOptions keep;
  keep.keep_bad_images = true;
  auto packed = Pack(dir / "src", dir / "out", keep);
  ASSERT_TRUE(packed.ok());
  for (const auto& w : packed->warnings) EXPECT_EQ(w.find("bmp"), std::string::npos) << w;  // a format it decodes
  std::shared_ptr<const Dataset> d = std::move(Dataset::Open(dir / "out")).value();
  auto o = SmallOptions();
  o.shuffle = false;
  o.batch_size = 4;
  auto loader = Loader::Create(d, o);
  ASSERT_TRUE(loader.ok());
  Status s = Consume(**loader);
  ASSERT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
  EXPECT_NE(s.message().find("a/pic"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("BMP"), std::string::npos) << s.message();
}

TEST(LoaderSafety, DamagedPngAndWebpAreCorruptionNamingTheSampleAndSkippable) {
  TempDir dir;
  for (int i = 0; i < 3; ++i) WriteFile(dir / ("src/a/" + std::to_string(i) + ".jpg"), MakeJpeg(64, 48, 7 + i));
  WriteFile(dir / "src/a/pic.png", std::string("\x89PNG\r\n\x1a\n", 8) + std::string(100, 'p'));
  WriteFile(dir / "src/a/pic2.webp", std::string("RIFF\x10\0\0\0WEBPVP8 ", 16) + std::string(100, 'w'));
  PackOptions keep;  // pack would refuse them
  keep.keep_bad_images = true;
  ASSERT_TRUE(Pack(dir / "src", dir / "out", keep).ok());
  std::shared_ptr<const Dataset> d = std::move(Dataset::Open(dir / "out")).value();
  {
    auto o = SmallOptions();
    o.shuffle = false;
    o.batch_size = 5;
    auto loader = Loader::Create(d, o);
    ASSERT_TRUE(loader.ok());
    Status s = Consume(**loader);
    ASSERT_EQ(s.code(), StatusCode::kCorruption) << s.ToString();
    EXPECT_NE(s.message().find("sample 'a/pic"), std::string::npos) << s.message();
  }
  auto o = SmallOptions();
  o.shuffle = false;
  o.batch_size = 5;
  o.on_corrupt = CorruptPolicy::kSkip;
  auto loader = Loader::Create(d, o);
  ASSERT_TRUE(loader.ok());
  EXPECT_TRUE(Consume(**loader).ok());
  EXPECT_EQ((*loader)->stats().corrupt_skipped, 2u);
}

}  // namespace
}  // namespace stoker
