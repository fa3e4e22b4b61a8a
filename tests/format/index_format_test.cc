#include "format/index_format.h"

#include <gtest/gtest.h>

#include "core/hash.h"
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

// Rewrites a version-4 index as versions 1-3 laid it out: 16-byte field
// entries (name offset, length, reserved), everything after them moved up.
std::vector<std::byte> AsVersion(std::vector<std::byte> v4, std::uint32_t version) {
  const auto num_fields = Load<std::uint32_t>(v4.data() + header::kNumFieldsOff);
  const std::uint64_t shrink = std::uint64_t{kFieldEntrySize - kFieldEntrySizeV1} * num_fields;
  std::vector<std::byte> out(v4.begin(), v4.begin() + kHeaderSize);
  for (std::uint32_t f = 0; f < num_fields; ++f) {
    const std::byte* e = v4.data() + kHeaderSize + std::uint64_t{f} * kFieldEntrySize;
    out.insert(out.end(), e, e + 12);
    out.insert(out.end(), 4, std::byte{0});
  }
  out.insert(out.end(), v4.begin() + kHeaderSize + std::uint64_t{kFieldEntrySize} * num_fields, v4.end());
  auto move_up = [&](std::size_t off) {
    const std::uint64_t v = Load<std::uint64_t>(out.data() + off) - shrink;
    std::memcpy(out.data() + off, &v, 8);
  };
  for (std::size_t off :
       {header::kShardsOff, header::kStringsOff, header::kRecordsOff, header::kKeysOff, header::kFileSizeOff})
    move_up(off);
  std::memcpy(out.data() + header::kVersionOff, &version, 4);
  const std::uint64_t meta =
      MetaChecksum(std::span<const std::byte>(out).first(Load<std::uint64_t>(out.data() + header::kRecordsOff)));
  std::memcpy(out.data() + header::kMetaChecksumOff, &meta, 8);
  return out;
}

// Version 4: each field's kind, sample count and bytes, the kinds of its
// samples widened; versions 1-3 (16-byte field entries) still open, with
// nothing recorded.
TEST(IndexFormat, RecordsFieldKindsAndCountsInVersionFour) {
  IndexBuilder b;
  auto s0 = b.AddShard("shard-000000.tar");
  const auto kind = [](FieldKind k) { return KindCode(k); };
  std::vector<IndexBuilder::Field> f1 = {{"jpg", 512, 100, kind(FieldKind::kImage)},
                                         {"n", 1024, 1, kind(FieldKind::kInt)},
                                         {"note", 1536, 2, kind(FieldKind::kText)},
                                         {"v", 2048, 3, kind(FieldKind::kInt)}};
  ASSERT_OK(b.AddSample(s0, "a", 1, 7, f1));
  std::vector<IndexBuilder::Field> f2 = {{"n", 2560, 3, kind(FieldKind::kFloat)},
                                         {"note", 3072, 5, kind(FieldKind::kInt)},
                                         {"v", 3584, 4, kind(FieldKind::kJson)}};
  ASSERT_OK(b.AddSample(s0, "b", 1, 7, f2));
  b.SetShardContents(s0, 8192, 1);
  ASSERT_OK_AND_ASSIGN(auto bytes, b.Finish());
  EXPECT_EQ(Load<std::uint32_t>(bytes.data() + header::kVersionOff), 4u);
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "idx"));
  ASSERT_EQ(view.fields().size(), 4u);
  const auto& jpg = view.fields()[0];
  EXPECT_TRUE(jpg.has_stats);
  EXPECT_EQ(jpg.kind, kind(FieldKind::kImage));
  EXPECT_EQ(jpg.samples, 1u);
  EXPECT_EQ(jpg.bytes, 100u);
  EXPECT_EQ(view.fields()[1].kind, kind(FieldKind::kFloat)) << "int and float widen to float";
  EXPECT_EQ(view.fields()[1].samples, 2u);
  EXPECT_EQ(view.fields()[1].bytes, 4u);
  EXPECT_EQ(view.fields()[2].kind, kind(FieldKind::kText)) << "numbers and text widen to text";
  EXPECT_EQ(view.fields()[3].kind, kind(FieldKind::kJson)) << "a number is JSON too";

  for (std::uint32_t old : {1u, 2u, 3u}) {
    const auto old_bytes = AsVersion(bytes, old);  // the view borrows them
    ASSERT_OK_AND_ASSIGN(IndexView v3, IndexView::Open(old_bytes, "idx"));
    ASSERT_EQ(v3.field_names(), view.field_names());
    EXPECT_FALSE(v3.fields()[0].has_stats);
    EXPECT_EQ(v3.fields()[0].kind, kKindNotRecorded);
    ASSERT_OK_AND_ASSIGN(auto rec, v3.record(1));
    EXPECT_EQ(rec.key, "b");
    EXPECT_EQ(rec.field(1).offset, 2560u);
  }

  // A kind past the last, reserved bytes set, or more samples than the index has are corrupt.
  auto damage = [&](std::size_t at, std::byte value) {
    auto copy = bytes;
    copy[kHeaderSize + at] = value;
    const std::uint64_t meta =
        MetaChecksum(std::span<const std::byte>(copy).first(Load<std::uint64_t>(copy.data() + header::kRecordsOff)));
    std::memcpy(copy.data() + header::kMetaChecksumOff, &meta, 8);
    return IndexView::Open(copy, "idx");
  };
  EXPECT_FALSE(damage(12, std::byte{kMaxKindCode + 1}).ok());
  EXPECT_FALSE(damage(14, std::byte{1}).ok());
  auto too_many = damage(16, std::byte{3});
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.error().message().find("counted in 3 samples"), std::string::npos) << too_many.error().message();
}

// A note after the keys, under a header flag.
TEST(IndexFormat, CarriesANote) {
  IndexBuilder b;
  auto s0 = b.AddShard("shard-000000.tar");
  std::vector<IndexBuilder::Field> f = {{"jpg", 512, 100}};
  ASSERT_TRUE(b.AddSample(s0, "k", 1, 7, f).ok());
  b.SetShardContents(s0, 2048, 1);
  ASSERT_OK_AND_ASSIGN(auto plain, b.Finish());
  b.SetNote(R"({"max_side":512})");
  ASSERT_OK_AND_ASSIGN(auto noted, b.Finish());
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
  EXPECT_FALSE(IndexView::Open(reflag(AsVersion(plain, 2), 1), "idx").ok()) << "flags in a version-2 index";
  const auto noted_v3 = AsVersion(noted, 3);  // the view borrows them
  ASSERT_OK_AND_ASSIGN(IndexView v3, IndexView::Open(noted_v3, "idx"));
  EXPECT_EQ(v3.note(), R"({"max_side":512})");
  b.SetNote(std::string(kMaxNoteBytes + 1, 'x'));
  EXPECT_FALSE(b.Finish().ok());
}

// Rewrites a version-6 index's restart section as version 5 laid it out:
// the pool as u32 offsets, not varints.
std::vector<std::byte> AsRestartVersion5(const std::vector<std::byte>& v6) {
  const auto records_off = Load<std::uint64_t>(v6.data() + header::kRecordsOff);
  // The section ends the file: find it from its own counts.
  std::size_t at = 0;
  for (std::size_t start = records_off; start + 16 <= v6.size(); ++start) {
    const auto entries = Load<std::uint64_t>(v6.data() + start), pool = Load<std::uint64_t>(v6.data() + start + 8);
    if (entries < 1000 && pool < v6.size() && start + 16 + entries * kRestartEntrySize + pool == v6.size()) {
      at = start;
      break;
    }
  }
  EXPECT_NE(at, 0u);
  const auto entries = Load<std::uint64_t>(v6.data() + at);
  const std::byte* pool = v6.data() + at + 16 + entries * kRestartEntrySize;
  std::vector<std::byte> out(v6.begin(),
                             v6.begin() + static_cast<std::ptrdiff_t>(at + 16 + entries * kRestartEntrySize));
  std::uint64_t next = 0;
  std::vector<std::uint32_t> all;
  for (std::uint64_t i = 0; i < entries; ++i) {
    std::byte* e = out.data() + at + 16 + i * kRestartEntrySize;
    const auto count = Load<std::uint32_t>(e + 12);
    const auto first = Load<std::uint64_t>(e + 16);
    std::vector<std::uint32_t> table;
    EXPECT_TRUE(ReadRestartVarints({pool + first, static_cast<std::size_t>(v6.size() - (pool - v6.data()) - first)},
                                   count, table));
    std::memcpy(e + 16, &next, 8);
    all.insert(all.end(), table.begin(), table.end());
    next += count;
  }
  std::memcpy(out.data() + at + 8, &next, 8);
  const auto* raw = reinterpret_cast<const std::byte*>(all.data());
  out.insert(out.end(), raw, raw + all.size() * 4);
  const std::uint32_t version = 5;
  const std::uint64_t size = out.size();
  std::memcpy(out.data() + header::kVersionOff, &version, 4);
  std::memcpy(out.data() + header::kFileSizeOff, &size, 8);
  const std::uint64_t data = Xxh3(std::span<const std::byte>(out).subspan(records_off));
  std::memcpy(out.data() + header::kDataChecksumOff, &data, 8);
  const std::uint64_t meta = MetaChecksum(std::span<const std::byte>(out).subspan(0, records_off));
  std::memcpy(out.data() + header::kMetaChecksumOff, &meta, 8);
  return out;
}

// Seekable JPEGs' restart tables after the note: varints in version 6 and
// 7, u32s in version 5 (still read); version 7 follows each with its region
// record.
TEST(IndexFormat, CarriesRestartTables) {
  IndexBuilder b;
  auto s0 = b.AddShard("shard-000000.tar");
  // Payloads: the bytes the region records check.
  std::vector<std::byte> jpg0(1000), cls0(1), jpg2(30), png2(30);
  for (std::size_t i = 0; i < jpg0.size(); ++i) jpg0[i] = static_cast<std::byte>(i * 7);
  cls0[0] = std::byte{'3'};
  for (std::size_t i = 0; i < 30; ++i) {
    jpg2[i] = static_cast<std::byte>(i);
    png2[i] = static_cast<std::byte>(100 + i);
  }
  // Differences of 1- and 2-byte varints; three MCU rows of one interval in t0, one in t2, two in t2b.
  const std::vector<std::uint32_t> t0 = {600, 700, 800, 950}, t2 = {10, 20}, t2b = {5, 5, 7};
  const JpegGeometry g0{48, 24, 8}, g2{16, 8, 8}, g2b{16, 32, 16};
  // Fields arrive in another order than the name order the index uses.
  std::vector<IndexBuilder::Field> f0 = {{"jpg", 512, 1000, 0, t0, g0, jpg0}, {"cls", 1536, 1, 0, {}, {}, cls0}};
  std::vector<IndexBuilder::Field> f1 = {{"jpg", 2048, 10}};
  std::vector<IndexBuilder::Field> f2 = {{"png", 4096, 30, 0, t2b, g2b, png2}, {"jpg", 3072, 30, 0, t2, g2, jpg2}};
  ASSERT_TRUE(b.AddSample(s0, "zero", 1, 7, f0).ok());
  ASSERT_TRUE(b.AddSample(s0, "one", 1, 7, f1).ok());
  ASSERT_TRUE(b.AddSample(s0, "two", 1, 7, f2).ok());
  b.SetShardContents(s0, 8192, 1);
  b.SetNote(R"({"seekable_jpeg":{}})");
  ASSERT_OK_AND_ASSIGN(auto bytes, b.Finish());
  EXPECT_EQ(Load<std::uint32_t>(bytes.data() + header::kVersionOff), 7u);
  // t0's varints take 2, 1, 1 and 2 bytes, t2's and t2b's a byte each; each record 3 varint bytes (all under
  // 128), the rest check and a check per MCU row.
  const std::size_t pool = (6 + 3 + 4 + 3 * 4) + (2 + 3 + 4 + 4) + (3 + 3 + 4 + 2 * 4);
  const std::size_t section = bytes.size() - (16 + 3 * kRestartEntrySize + pool);
  EXPECT_EQ(Load<std::uint64_t>(bytes.data() + section + 8), pool);
  auto as_version = [](std::vector<std::byte> index, std::uint32_t version) {
    std::memcpy(index.data() + header::kVersionOff, &version, 4);
    const auto records_off = Load<std::uint64_t>(index.data() + header::kRecordsOff);
    const std::uint64_t meta = MetaChecksum(std::span<const std::byte>(index).subspan(0, records_off));
    std::memcpy(index.data() + header::kMetaChecksumOff, &meta, 8);
    return index;
  };
  for (std::uint32_t version : {7u, 6u, 5u}) {
    const auto index = version == 5 ? AsRestartVersion5(bytes) : as_version(bytes, version);
    ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(index, "idx"));
    EXPECT_EQ(view.note(), R"({"seekable_jpeg":{}})");
    EXPECT_EQ(view.num_restart_tables(), 3u);
    EXPECT_EQ(view.has_region_records(), version == 7);
    // Field order: cls, jpg, png.
    RegionRecord region;
    auto table = [&](std::uint64_t sample, std::uint32_t field) {
      std::vector<std::uint32_t> out = {99};
      region.rest_check = 1;
      const bool found = view.restart_table(sample, field, out, &region);
      EXPECT_EQ(found, !out.empty());
      return out;
    };
    EXPECT_EQ(table(0, 1), t0);
    if (version == 7) {
      // Each row's bytes, the last to the payload's end; the rest: the other fields, then the head.
      ASSERT_EQ(region.rows(), 3u);
      EXPECT_EQ(region.geometry.width, 48u);
      EXPECT_EQ(region.geometry.height, 24u);
      EXPECT_EQ(region.geometry.mcu_height, 8u);
      const std::span<const std::byte> j0(jpg0);
      EXPECT_EQ(region.row_checks[0], PieceCheck(j0.subspan(600, 100)));
      EXPECT_EQ(region.row_checks[1], PieceCheck(j0.subspan(700, 100)));
      EXPECT_EQ(region.row_checks[2], PieceCheck(j0.subspan(800)));
      std::vector<std::byte> rest(cls0);
      rest.insert(rest.end(), jpg0.begin(), jpg0.begin() + 600);
      EXPECT_EQ(region.rest_check, PieceCheck(rest));
      // What a reader of rows 1-2 checks.
      const std::span<const std::byte> others[] = {cls0};
      EXPECT_TRUE(RegionPiecesAgree(region, t0, 1000, others, j0.first(600), 1, j0.subspan(700)));
      EXPECT_TRUE(RegionPiecesAgree(region, t0, 1000, others, j0.first(600), 0, j0.subspan(600, 100)));
      EXPECT_FALSE(RegionPiecesAgree(region, t0, 1000, others, j0.first(600), 1, j0.subspan(700, 150)))
          << "rows cut short";
      EXPECT_FALSE(RegionPiecesAgree(region, t0, 1000, others, j0.first(600), 0, j0.subspan(700, 100)))
          << "the wrong row";
      EXPECT_FALSE(RegionPiecesAgree(region, t0, 1000, {}, j0.first(600), 1, j0.subspan(700))) << "no .cls";
      auto damaged = jpg0;
      damaged[750] ^= std::byte{1};
      EXPECT_FALSE(RegionPiecesAgree(region, t0, 1000, others, j0.first(600), 1, std::span(damaged).subspan(700)));
      damaged = jpg0;
      damaged[3] ^= std::byte{1};
      EXPECT_FALSE(RegionPiecesAgree(region, t0, 1000, others, std::span(damaged).first(600), 1, j0.subspan(700)));
    } else {
      EXPECT_EQ(region.rows(), 0u) << "version " << version << " has no region records";
    }
    EXPECT_TRUE(table(0, 0).empty());
    EXPECT_TRUE(table(1, 1).empty());
    EXPECT_EQ(table(2, 1), t2);
    EXPECT_EQ(region.rows(), version == 7 ? 1u : 0u);
    EXPECT_EQ(table(2, 2), t2b);
    EXPECT_EQ(region.rows(), version == 7 ? 2u : 0u);
    EXPECT_TRUE(table(3, 1).empty());
  }

  // The section must end the file exactly, and only versions 5-7 know its flag.
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_FALSE(IndexView::Open(longer, "idx").ok());
  auto count = bytes;
  count[section] = std::byte{4};
  EXPECT_FALSE(IndexView::Open(count, "idx").ok());
  EXPECT_FALSE(IndexView::Open(AsVersion(bytes, 4), "idx").ok());
  std::vector<std::uint32_t> out;
  // An entry whose table starts past the pool gives no table, never a wild read.
  auto wild = bytes;
  const std::uint64_t far = 1000;
  std::memcpy(wild.data() + section + 16 + 16, &far, 8);
  ASSERT_OK_AND_ASSIGN(IndexView wild_view, IndexView::Open(wild, "idx"));
  EXPECT_FALSE(wild_view.restart_table(0, 1, out));
  EXPECT_TRUE(out.empty());
  // Nor one whose count reads past the pool's end (the last table, sample 2's png, ends near the pool's end),
  // nor a region record that does not fit the table (a count of 4 takes the record's first bytes as offsets).
  auto overlong = bytes;
  const std::uint32_t more = 20;
  std::memcpy(overlong.data() + section + 16 + 2 * kRestartEntrySize + 12, &more, 4);
  ASSERT_OK_AND_ASSIGN(IndexView overlong_view, IndexView::Open(overlong, "idx"));
  EXPECT_FALSE(overlong_view.restart_table(2, 2, out));
  // A record whose rows do not divide the table's intervals gives the table without a record.
  auto cut = bytes;
  cut[bytes.size() - 2 * 4 - 4 - 3 + 1] = std::byte{64};  // t2b's record claims a 16x64 image: 4 MCU rows
  const auto records_off = Load<std::uint64_t>(cut.data() + header::kRecordsOff);
  const std::uint64_t data = Xxh3(std::span<const std::byte>(cut).subspan(records_off));
  std::memcpy(cut.data() + header::kDataChecksumOff, &data, 8);
  const std::uint64_t meta = MetaChecksum(std::span<const std::byte>(cut).subspan(0, records_off));
  std::memcpy(cut.data() + header::kMetaChecksumOff, &meta, 8);
  ASSERT_OK_AND_ASSIGN(IndexView cut_view, IndexView::Open(cut, "idx"));
  RegionRecord cut_region;
  cut_region.rest_check = 1;
  EXPECT_TRUE(cut_view.restart_table(2, 2, out, &cut_region));
  EXPECT_EQ(cut_region.rows(), 0u);
  EXPECT_EQ(cut_region.rest_check, 0u);
  // Without tables the writer stays at version 4, for older readers.
  IndexBuilder plain;
  auto p0 = plain.AddShard("shard-000000.tar");
  ASSERT_TRUE(plain.AddSample(p0, "k", 1, 7, f1).ok());
  ASSERT_OK_AND_ASSIGN(auto plain_bytes, plain.Finish());
  EXPECT_EQ(Load<std::uint32_t>(plain_bytes.data() + header::kVersionOff), 4u);
  std::vector<IndexBuilder::Field> one = {
      {"jpg", 2048, 1000, 0, std::span<const std::uint32_t>(t0).first(1), g0, jpg0}};
  EXPECT_FALSE(plain.AddSample(p0, "short", 1, 7, one).ok());
  const std::vector<std::uint32_t> down = {600, 599};
  std::vector<IndexBuilder::Field> decreasing = {{"jpg", 2048, 1000, 0, down, g2, jpg0}};
  EXPECT_FALSE(plain.AddSample(p0, "down", 1, 7, decreasing).ok());
  // A table must tile the MCU rows its geometry gives, and come with its payload.
  std::vector<IndexBuilder::Field> untiled = {{"jpg", 2048, 1000, 0, t0, g2b, jpg0}};
  EXPECT_FALSE(plain.AddSample(p0, "untiled", 1, 7, untiled).ok());
  std::vector<IndexBuilder::Field> no_payload = {{"jpg", 2048, 1000, 0, t0, g0}};
  EXPECT_FALSE(plain.AddSample(p0, "no payload", 1, 7, no_payload).ok());
  std::vector<IndexBuilder::Field> past = {{"jpg", 2048, 900, 0, t0, g0, std::span(jpg0).first(900)}};
  EXPECT_FALSE(plain.AddSample(p0, "past", 1, 7, past).ok());
}

// Restart varints that do not hold a table are refused, whatever the bytes.
TEST(IndexFormat, RestartVarintsRefuseWhatDoesNotDecode) {
  std::vector<std::uint32_t> table;
  auto bytes = [](std::initializer_list<int> v) {
    std::vector<std::byte> b;
    for (int x : v) b.push_back(static_cast<std::byte>(x));
    return b;
  };
  EXPECT_TRUE(ReadRestartVarints(bytes({0x7F, 0x81, 0x01}), 2, table));
  EXPECT_EQ(table, (std::vector<std::uint32_t>{127, 256}));
  EXPECT_FALSE(ReadRestartVarints(bytes({0x7F, 0x81}), 2, table)) << "cut inside a varint";
  EXPECT_TRUE(table.empty());
  EXPECT_FALSE(ReadRestartVarints(bytes({0x7F}), 2, table)) << "fewer values than the count";
  EXPECT_FALSE(ReadRestartVarints(bytes({0x80, 0x80, 0x80, 0x80, 0x80, 0x01}), 1, table)) << "six bytes";
  EXPECT_FALSE(ReadRestartVarints(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x1F}), 1, table)) << "over 32 bits";
  EXPECT_TRUE(ReadRestartVarints(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x0F}), 1, table));
  EXPECT_EQ(table, std::vector<std::uint32_t>{UINT32_MAX});
  EXPECT_FALSE(ReadRestartVarints(bytes({0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x01}), 2, table)) << "a sum over 32 bits";
  std::vector<std::byte> written;
  const std::vector<std::uint32_t> any = {0, 0, 1, 128, 16511, 16512, UINT32_MAX - 1, UINT32_MAX};
  AppendRestartVarints(any, written);
  ASSERT_TRUE(ReadRestartVarints(written, static_cast<std::uint32_t>(any.size()), table));
  EXPECT_EQ(table, any);
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
