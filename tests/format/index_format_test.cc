#include "format/index_format.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::index_format {
namespace {

std::vector<std::byte> SmallIndex() {
  IndexBuilder b;
  auto s0 = b.AddShard("shard-000000.tar");
  std::vector<IndexBuilder::Field> f1 = {{"jpg", 512, 100}, {"cls", 1536, 1}};
  EXPECT_TRUE(b.AddSample(s0, "a/one", 3, 0x1111, f1).ok());
  std::vector<IndexBuilder::Field> f2 = {{"jpg", 2560, 50}};
  EXPECT_TRUE(b.AddSample(s0, "a/two", kNoLabel, 0x2222, f2).ok());
  b.SetShardContents(s0, 4096, 0xabcd);
  auto s1 = b.AddShard("shard-000001.tar");
  std::vector<IndexBuilder::Field> f3 = {{"cls", 512, 1}, {"seg.png", 1536, 10}};
  EXPECT_TRUE(b.AddSample(s1, "b/three", 0, 0x3333, f3).ok());
  b.SetShardContents(s1, 3072, 0xef);
  auto bytes = b.Finish();
  EXPECT_TRUE(bytes.ok());
  return *bytes;
}

TEST(IndexFormat, RoundTrips) {
  auto bytes = SmallIndex();
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "idx"));
  EXPECT_EQ(view.num_samples(), 3u);
  EXPECT_EQ(view.field_names(), (std::vector<std::string>{"cls", "jpg", "seg.png"}));  // sorted
  ASSERT_EQ(view.shards().size(), 2u);
  EXPECT_EQ(view.shards()[0].path, "shard-000000.tar");
  EXPECT_EQ(view.shards()[0].size, 4096u);
  EXPECT_EQ(view.shards()[0].checksum, 0xabcdu);
  EXPECT_EQ(view.shards()[1].first_sample, 2u);
  ASSERT_OK_AND_ASSIGN(auto r0, view.record(0));
  EXPECT_EQ(r0.key, "a/one");
  EXPECT_EQ(r0.label, 3);
  EXPECT_EQ(r0.checksum, 0x1111u);
  EXPECT_EQ(r0.field(0).offset, 1536u);  // cls
  EXPECT_EQ(r0.field(1).size, 100u);     // jpg
  EXPECT_FALSE(r0.field(2).present());
  ASSERT_OK_AND_ASSIGN(auto r1, view.record(1));
  EXPECT_EQ(r1.label, kNoLabel);
  EXPECT_FALSE(r1.field(0).present());
  ASSERT_OK_AND_ASSIGN(auto r2, view.record(2));
  EXPECT_EQ(r2.shard, 1u);
  EXPECT_EQ(r2.key, "b/three");
  EXPECT_FALSE(view.record(3).ok());
}

TEST(IndexFormat, IsDeterministic) {
  EXPECT_EQ(SmallIndex(), SmallIndex());
}

TEST(IndexFormat, RejectsForeignAndDamagedFiles) {
  auto bytes = SmallIndex();
  std::string foreign =
      "this is not an index, just some text that is long enough to fill a whole header block......"
      "..........................................";
  EXPECT_EQ(IndexView::Open(stoker::testing::Bytes(foreign), "f").error().code(), StatusCode::kCorruption);
  EXPECT_FALSE(IndexView::Open(std::span(bytes).first(100), "short").ok());
  EXPECT_FALSE(IndexView::Open(std::span(bytes).first(bytes.size() - 1), "cut").ok());
  // Any flipped byte in the header and tables is caught by Open.
  auto meta_end = Load<std::uint64_t>(bytes.data() + header::kRecordsOff);
  for (std::size_t i = 0; i < meta_end; ++i) {
    auto damaged = bytes;
    damaged[i] ^= std::byte{0x01};
    EXPECT_FALSE(IndexView::Open(damaged, "d").ok()) << "flip at byte " << i;
  }
  // A newer version is reported as such.
  auto future = bytes;
  future[header::kVersionOff] = std::byte{9};
  EXPECT_EQ(IndexView::Open(future, "v").error().code(), StatusCode::kUnimplemented);
}

// Every error names the index, even after its name was handed to the view
// (an earlier version printed "corruption: : not a valid stoker index").
TEST(IndexFormat, EveryOpenErrorNamesTheIndex) {
  auto bytes = SmallIndex();
  auto meta_end = Load<std::uint64_t>(bytes.data() + header::kRecordsOff);
  for (std::size_t i = 0; i < meta_end; ++i) {
    auto damaged = bytes;
    damaged[i] ^= std::byte{0x40};
    auto view = IndexView::Open(damaged, "data/index.stoker");
    ASSERT_FALSE(view.ok());
    EXPECT_TRUE(view.error().message().starts_with("data/index.stoker: ")) << view.error().message();
  }
}

TEST(IndexFormat, RejectsNulBytesInPathsAndKeys) {
  IndexBuilder b;
  const std::uint32_t shard = b.AddShard(std::string("shard-0.tar\0../../etc/passwd", 28));
  b.SetShardContents(shard, 100, 1);
  const IndexBuilder::Field f{"jpg", 0, 10};
  ASSERT_OK(b.AddSample(shard, "k", 0, 0, std::span(&f, 1)));
  ASSERT_OK_AND_ASSIGN(auto bytes, b.Finish());
  auto view = IndexView::Open(bytes, "i");
  ASSERT_FALSE(view.ok());
  EXPECT_NE(view.error().message().find("shard 0 path contains a NUL byte"), std::string::npos)
      << view.error().message();
  IndexBuilder k;
  const std::uint32_t s2 = k.AddShard("s.tar");
  k.SetShardContents(s2, 100, 1);
  ASSERT_OK(k.AddSample(s2, std::string_view("a\0b", 3), 0, 0, std::span(&f, 1)));
  ASSERT_OK_AND_ASSIGN(auto bytes2, k.Finish());
  ASSERT_OK_AND_ASSIGN(IndexView view2, IndexView::Open(bytes2, "i"));
  auto r = view2.record(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("key contains a NUL byte"), std::string::npos);
}

TEST(IndexFormat, ReadsVersionOneAndCountsSkippedMembers) {
  IndexBuilder b;
  const std::uint32_t shard = b.AddShard("s.tar");
  b.SetShardContents(shard, 100, 1);
  b.SetSkippedMembers(3);
  ASSERT_OK_AND_ASSIGN(auto bytes, b.Finish());
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "i"));
  EXPECT_EQ(view.skipped_members(), 3u);
  // A version 1 index (no count: zero there) still opens.
  std::uint32_t one = 1;
  std::memcpy(bytes.data() + header::kVersionOff, &one, 4);
  std::memset(bytes.data() + header::kSkippedMembersOff, 0, 8);
  const std::uint64_t meta = MetaChecksum(
      std::span<const std::byte>(bytes).subspan(0, Load<std::uint64_t>(bytes.data() + header::kRecordsOff)));
  std::memcpy(bytes.data() + header::kMetaChecksumOff, &meta, 8);
  ASSERT_OK_AND_ASSIGN(IndexView old, IndexView::Open(bytes, "i"));
  EXPECT_EQ(old.skipped_members(), 0u);
}

// Version 3: a note after the keys, under a header flag; without a note the
// writer keeps version 2, byte for byte what it wrote before.
TEST(IndexFormat, CarriesANoteInVersionThree) {
  IndexBuilder b;
  auto s0 = b.AddShard("shard-000000.tar");
  std::vector<IndexBuilder::Field> f = {{"jpg", 512, 100}};
  ASSERT_TRUE(b.AddSample(s0, "k", 1, 7, f).ok());
  b.SetShardContents(s0, 2048, 1);
  ASSERT_OK_AND_ASSIGN(auto plain, b.Finish());
  EXPECT_EQ(Load<std::uint32_t>(plain.data() + header::kVersionOff), 2u);
  b.SetNote(R"({"max_side":512})");
  ASSERT_OK_AND_ASSIGN(auto noted, b.Finish());
  EXPECT_EQ(Load<std::uint32_t>(noted.data() + header::kVersionOff), 3u);
  EXPECT_EQ(noted.size(), plain.size() + 8 + 16);
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(noted, "idx"));
  EXPECT_EQ(view.note(), R"({"max_side":512})");
  ASSERT_OK_AND_ASSIGN(IndexView plain_view, IndexView::Open(plain, "idx"));
  EXPECT_TRUE(plain_view.note().empty());

  // A damaged note size, a note without its flag, or unknown flags are corrupt (the data checksum
  // covers the note too, for verify).
  auto bad_size = noted;
  bad_size[plain.size()] = std::byte{0x30};
  EXPECT_FALSE(IndexView::Open(bad_size, "idx").ok());
  auto reflag = [&](std::vector<std::byte> bytes, std::uint32_t flags) {
    std::memcpy(bytes.data() + header::kFlagsOff, &flags, 4);
    const std::uint64_t records = Load<std::uint64_t>(bytes.data() + header::kRecordsOff);
    const std::uint64_t meta = MetaChecksum(std::span<const std::byte>(bytes).first(records));
    std::memcpy(bytes.data() + header::kMetaChecksumOff, &meta, 8);
    return bytes;
  };
  EXPECT_FALSE(IndexView::Open(reflag(noted, 0), "idx").ok());
  EXPECT_FALSE(IndexView::Open(reflag(noted, 3), "idx").ok());
  EXPECT_FALSE(IndexView::Open(reflag(plain, 1), "idx").ok()) << "flags in a version-2 index";
  b.SetNote(std::string(kMaxNoteBytes + 1, 'x'));
  EXPECT_FALSE(b.Finish().ok());
}

TEST(IndexFormat, ValidatesRecords) {
  auto bytes = SmallIndex();
  auto records = Load<std::uint64_t>(bytes.data() + header::kRecordsOff);
  auto damaged = bytes;
  damaged[records] = std::byte{7};  // shard id of sample 0
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(damaged, "idx"));
  auto r = view.record(0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("shard id out of range"), std::string::npos);
  // A field range past the shard's end.
  damaged = bytes;
  damaged[records + kRecordBaseSize + kFieldSlotSize + 8 + 3] = std::byte{1};  // jpg size of sample 0 += 16 MiB
  ASSERT_OK_AND_ASSIGN(IndexView view2, IndexView::Open(damaged, "idx"));
  EXPECT_FALSE(view2.record(0).ok());
}

TEST(IndexFormat, BuilderRejectsDuplicateFieldsAndDisorder) {
  IndexBuilder b;
  auto s = b.AddShard("x.tar");
  std::vector<IndexBuilder::Field> dup = {{"jpg", 0, 1}, {"jpg", 2, 1}};
  EXPECT_FALSE(b.AddSample(s, "k", 0, 0, dup).ok());
  b.AddShard("y.tar");
  std::vector<IndexBuilder::Field> one = {{"jpg", 0, 1}};
  EXPECT_EQ(b.AddSample(s, "k", 0, 0, one).code(), StatusCode::kInternal);
}

TEST(IndexFormat, EmptyIndex) {
  IndexBuilder b;
  ASSERT_OK_AND_ASSIGN(auto bytes, b.Finish());
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "e"));
  EXPECT_EQ(view.num_samples(), 0u);
}

}  // namespace
}  // namespace stoker::index_format
