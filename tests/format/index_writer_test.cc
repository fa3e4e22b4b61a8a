// WriteIndex: an index streamed section by section is the index IndexBuilder
// makes in memory; a section that disagrees with its tables, or a sink that
// fails, stops the write with a clear error; restart tables stored with
// longer varints than needed read back as the same tables.
#include "format/index_writer.h"

#include <gtest/gtest.h>

#include "core/hash.h"
#include "test_util.h"

namespace stoker::index_format {
namespace {

// Two samples in one shard; sample 1's "jpg" has a restart table (three MCU
// rows of one interval) stored with a 2-byte varint where 1 byte would do.
class HandWrittenSections final : public IndexSections {
 public:
  static constexpr std::uint32_t kTable[] = {10, 20, 30, 40};
  // 10 as 0x8A 0x00 (not minimal), then 10, 10, 10; the region record: 48x24, MCU rows of 8.
  static std::vector<std::byte> Pool() {
    std::vector<std::byte> pool = {std::byte{0x8A}, std::byte{0x00}, std::byte{10}, std::byte{10},
                                   std::byte{10},   std::byte{48},   std::byte{24}, std::byte{8}};
    for (std::uint32_t check : {7u, 1u, 2u, 3u}) {
      const auto* b = reinterpret_cast<const std::byte*>(&check);
      pool.insert(pool.end(), b, b + 4);
    }
    return pool;
  }
  static IndexTables Tables() {
    IndexTables t;
    t.fields = {{"cls", KindCode(FieldKind::kInt), 2, 2, true}, {"jpg", KindCode(FieldKind::kImage), 1, 50, true}};
    t.shards = {{"shard-000000.tar", 4096, 99, 0, 2}};
    t.num_samples = 2;
    t.keys_bytes = 6;  // "a" "bbbbb"
    t.note = R"({"seekable_jpeg":{}})";
    t.restart_entries = 1;
    t.restart_pool_bytes = Pool().size();
    return t;
  }
  int records_short_by = 0;  // records written fewer than the tables say
  bool keys_change = false;  // the second pass writes other keys of the same size
  int key_passes = 0;

  Status WriteRecords(ByteSink& out) override {
    std::vector<std::byte> r(RecordSize(2));
    EncodeRecord(r.data(), 0, 1, 0, 4, 0x1111, 2);
    EncodeFieldSlot(r.data(), 0, 512, 1);
    STOKER_RETURN_IF_ERROR(out.Write(r));
    if (records_short_by > 0) return Status::Ok();
    EncodeRecord(r.data(), 0, 5, 1, 5, 0x2222, 2);
    EncodeFieldSlot(r.data(), 0, 1536, 1);
    EncodeFieldSlot(r.data(), 1, 2048, 50);
    return out.Write(r);
  }
  Status WriteKeys(ByteSink& out) override {
    return out.Write(testing::Bytes(keys_change && key_passes++ > 0 ? "abbbbc" : "abbbbb"));
  }
  Status WriteRestartEntries(ByteSink& out) override {
    std::byte e[kRestartEntrySize];
    EncodeRestartEntry(e, 1, 1, 4, 0);
    return out.Write(e);
  }
  Status WriteRestartPool(ByteSink& out) override { return out.Write(Pool()); }
};

TEST(IndexWriter, StreamedSectionsMakeAnIndexThatReadsBack) {
  HandWrittenSections sections;
  std::vector<std::byte> bytes;
  VectorSink sink(bytes);
  ASSERT_TRUE(WriteIndex(HandWrittenSections::Tables(), sections, sink).ok());
  ASSERT_OK_AND_ASSIGN(IndexView view, IndexView::Open(bytes, "hand"));
  EXPECT_EQ(Xxh3(view.data_section()), view.data_checksum());
  EXPECT_EQ(view.num_samples(), 2u);
  EXPECT_EQ(view.field_names(), (std::vector<std::string>{"cls", "jpg"}));
  EXPECT_EQ(view.fields()[1].samples, 1u);
  EXPECT_EQ(view.note(), R"({"seekable_jpeg":{}})");
  ASSERT_OK_AND_ASSIGN(auto r1, view.record(1));
  EXPECT_EQ(r1.key, "bbbbb");
  EXPECT_EQ(r1.label, 5);
  EXPECT_EQ(r1.field(1).offset, 2048u);
  std::vector<std::uint32_t> table;
  RegionRecord region;
  std::span<const std::byte> stored;
  std::uint64_t sample = 0;
  std::uint32_t field = 0;
  ASSERT_TRUE(view.restart_table_at(0, &sample, &field, table, region, stored));
  EXPECT_EQ(sample, 1u);
  EXPECT_EQ(field, 1u);
  EXPECT_EQ(table, (std::vector<std::uint32_t>(std::begin(HandWrittenSections::kTable),
                                               std::end(HandWrittenSections::kTable))));
  EXPECT_EQ(region.geometry, (JpegGeometry{48, 24, 8}));
  EXPECT_EQ(region.row_checks, (std::vector<std::uint32_t>{1, 2, 3}));
  // The stored bytes are the whole entry as written; minimal encoding is a byte shorter.
  EXPECT_EQ(stored.size(), HandWrittenSections::Pool().size());
  EXPECT_EQ(view.restart_table_bytes(0, stored.size()).data(), stored.data());
  std::vector<std::byte> minimal;
  AppendRestartTable(table, region, minimal);
  EXPECT_EQ(minimal.size() + 1, stored.size());
}

TEST(IndexWriter, ASectionThatDisagreesWithItsTablesStopsTheWrite) {
  HandWrittenSections sections;
  sections.records_short_by = 1;
  std::vector<std::byte> bytes;
  VectorSink sink(bytes);
  Status s = WriteIndex(HandWrittenSections::Tables(), sections, sink);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("record section is 64 bytes where its tables say 128"), std::string::npos) << s.message();
  EXPECT_TRUE(bytes.empty()) << "the hashing pass finds it before anything is written";
  // Shards that do not hold the samples the tables count, and limits.
  IndexTables tables = HandWrittenSections::Tables();
  tables.shards[0].num_samples = 3;
  s = WriteIndex(tables, sections, sink);
  EXPECT_NE(s.message().find("shards hold 3 samples where the tables say 2"), std::string::npos) << s.message();
  tables = HandWrittenSections::Tables();
  tables.note = std::string(kMaxNoteBytes + 1, 'x');
  EXPECT_EQ(WriteIndex(tables, sections, sink).code(), StatusCode::kInvalidArgument);
  // Sections read from files that change between the hashing pass and the writing one.
  HandWrittenSections changing;
  changing.keys_change = true;
  s = WriteIndex(HandWrittenSections::Tables(), changing, sink);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_NE(s.message().find("changed between hashing and writing"), std::string::npos) << s.message();
}

// A sink that fails after `room` bytes, as a full disk does.
class FullSink final : public ByteSink {
 public:
  explicit FullSink(std::size_t room) : room_(room) {}
  Status Write(std::span<const std::byte> bytes) override {
    if (bytes.size() > room_) return Status::ResourceExhausted("no space left on device");
    room_ -= bytes.size();
    return Status::Ok();
  }

 private:
  std::size_t room_;
};

TEST(IndexWriter, BuilderStreamsTheBytesItMakesInMemoryAndStopsAtASinkError) {
  IndexBuilder b;
  const auto shard = b.AddShard("shard-000000.tar");
  // Enough samples that the write takes several of the writer's 1 MiB blocks.
  for (int i = 0; i < 40000; ++i) {
    const std::vector<IndexBuilder::Field> fields = {{"cls", 512 + 2048u * i, 2}, {"jpg", 1536 + 2048u * i, 500}};
    ASSERT_TRUE(b.AddSample(shard, "sample-" + std::to_string(i), i % 10, i, fields).ok());
  }
  b.SetShardContents(shard, 2048u * 40000, 5);
  ASSERT_OK_AND_ASSIGN(auto in_memory, b.Finish());
  std::vector<std::byte> streamed;
  VectorSink sink(streamed);
  ASSERT_TRUE(b.FinishTo(sink).ok());
  EXPECT_EQ(streamed, in_memory);
  EXPECT_GT(in_memory.size(), std::size_t{5} << 19);  // 2.5 MiB: the full sink below stops it midway
  FullSink full(std::size_t{2} << 20);
  Status s = b.FinishTo(full);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
}

}  // namespace
}  // namespace stoker::index_format
