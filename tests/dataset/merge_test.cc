// MergeDatasets: parts written apart read as one dataset (every sample, its
// bytes, label, fields and seekable JPEG tables as in its part), from their
// indexes alone; what would make the merged dataset wrong is refused by name.
#include "stoker/merge.h"

#include <filesystem>
#include <functional>

#include <gtest/gtest.h>

#include "format/index_writer.h"
#include "pipeline/loader_test_util.h"
#include "stoker/dataset.h"
#include "stoker/dataset_writer.h"
#include "stoker/pack.h"
#include "test_util.h"

namespace stoker {
namespace {

using testing::Bytes;
using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

// A part written by a DatasetWriter: `n` samples keyed prefix + i, a label,
// a text and a "score" of `score_kind` (int or float text).
void WritePart(const std::string& dir, const std::string& prefix, int n, FieldKind score_kind,
               std::vector<std::string> class_names = {"cat", "dog"}) {
  DatasetWriterOptions options;
  options.target_shard_bytes = 4096;
  options.class_names = std::move(class_names);
  auto writer = DatasetWriter::Create(dir, options);
  ASSERT_TRUE(writer.ok()) << writer.error().ToString();
  for (int i = 0; i < n; ++i) {
    const std::string label = std::to_string(i % 2), text = prefix + " text " + std::to_string(i),
                      score = score_kind == FieldKind::kInt ? std::to_string(i) : std::to_string(i) + ".5";
    const SampleField fields[] = {{"cls", Bytes(label), FieldKind::kInt},
                                  {"score", Bytes(score), score_kind},
                                  {"txt", Bytes(text), FieldKind::kText}};
    ASSERT_TRUE((*writer)->Add(prefix + std::to_string(i), fields).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
}

std::unique_ptr<Dataset> Open(const std::string& dir) {
  auto opened = Dataset::Open(dir);
  EXPECT_TRUE(opened.ok()) << opened.error().ToString();
  return opened.ok() ? std::move(*opened) : nullptr;
}

// Every sample of `part` is sample `first + i` of `merged`, with the same
// key, label, fields (bytes read back) and restart table with its region
// record.
void ExpectPartIn(const Dataset& part, const Dataset& merged, std::uint64_t first) {
  for (std::uint64_t i = 0; i < part.num_samples(); ++i) {
    auto a = part.Sample(i);
    auto b = merged.Sample(first + i);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->key, b->key);
    EXPECT_EQ(a->label, b->label);
    for (std::size_t f = 0; f < part.field_names().size(); ++f) {
      const auto mf = merged.FieldIndex(part.field_names()[f]);
      ASSERT_TRUE(mf.has_value());
      EXPECT_EQ(a->fields[f].has_value(), b->fields[*mf].has_value());
      if (!a->fields[f]) continue;
      auto bytes_a = part.ReadField(i, f);
      auto bytes_b = merged.ReadField(first + i, *mf);
      ASSERT_TRUE(bytes_a.ok() && bytes_b.ok()) << a->key;
      EXPECT_EQ(*bytes_a, *bytes_b) << a->key;
      std::vector<std::uint32_t> table_a, table_b;
      RegionRecord region_a, region_b;
      EXPECT_EQ(part.RestartTable(i, f, table_a, &region_a), merged.RestartTable(first + i, *mf, table_b, &region_b));
      EXPECT_EQ(table_a, table_b) << a->key;
      EXPECT_EQ(region_a.geometry, region_b.geometry);
      EXPECT_EQ(region_a.rest_check, region_b.rest_check);
      EXPECT_EQ(region_a.row_checks, region_b.row_checks);
      if (!table_b.empty()) {
        EXPECT_TRUE(merged.CheckRegionRecord(*b, *mf, *bytes_b).ok()) << a->key;
      }
    }
  }
}

// Restart-table entry `e` of `view`: whose it is, its bytes as stored and
// its shortest encoding.
struct StoredTable {
  std::uint64_t sample = 0;
  std::uint32_t field = 0, offsets = 0;
  std::vector<std::uint32_t> table;
  RegionRecord region;
  std::span<const std::byte> stored;
  std::vector<std::byte> shortest;
};
StoredTable ReadStoredTable(const index_format::IndexView& view, std::uint64_t e) {
  StoredTable t;
  EXPECT_TRUE(view.restart_table_at(e, &t.sample, &t.field, t.table, t.region, t.stored)) << "entry " << e;
  t.offsets = static_cast<std::uint32_t>(t.table.size());
  index_format::AppendRestartTable(t.table, t.region, t.shortest);
  return t;
}

// The index at `path` with each restart table (and region record) stored as
// `store` gives it.
void RewriteRestartTables(const std::string& path,
                          const std::function<std::vector<std::byte>(const StoredTable&)>& store) {
  const std::string file = ReadFile(path);
  const std::span<const std::byte> bytes = std::as_bytes(std::span(file));
  ASSERT_OK_AND_ASSIGN(auto view, index_format::IndexView::Open(bytes, path));
  index_format::IndexTables tables;
  tables.fields = view.fields();
  tables.shards = view.shards();
  tables.num_samples = view.num_samples();
  for (std::uint64_t i = 0; i < view.num_samples(); ++i) tables.keys_bytes += view.record(i)->key.size();
  tables.skipped_members = view.skipped_members();
  tables.note = std::string(view.note());
  std::vector<std::vector<std::byte>> pool;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> owners;
  std::vector<std::uint32_t> counts;
  for (std::uint64_t e = 0; e < view.num_restart_tables(); ++e) {
    const StoredTable t = ReadStoredTable(view, e);
    std::vector<std::byte> encoded = store(t);
    tables.restart_pool_bytes += encoded.size();
    pool.push_back(std::move(encoded));
    owners.emplace_back(t.sample, t.field);
    counts.push_back(t.offsets);
  }
  tables.restart_entries = pool.size();
  // Records and keys as they are; restart entries and tables as padded.
  struct Sections final : index_format::IndexSections {
    std::span<const std::byte> records, keys;
    std::vector<std::vector<std::byte>> pool;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> owners;
    std::vector<std::uint32_t> counts;
    Status WriteRecords(index_format::ByteSink& out) override { return out.Write(records); }
    Status WriteKeys(index_format::ByteSink& out) override { return out.Write(keys); }
    Status WriteRestartEntries(index_format::ByteSink& out) override {
      std::uint64_t at = 0;
      for (std::size_t e = 0; e < pool.size(); ++e) {
        std::byte entry[index_format::kRestartEntrySize];
        index_format::EncodeRestartEntry(entry, owners[e].first, owners[e].second, counts[e], at);
        STOKER_RETURN_IF_ERROR(out.Write(entry));
        at += pool[e].size();
      }
      return Status::Ok();
    }
    Status WriteRestartPool(index_format::ByteSink& out) override {
      for (const auto& table : pool) STOKER_RETURN_IF_ERROR(out.Write(table));
      return Status::Ok();
    }
  } sections;
  const std::uint64_t records = view.num_samples() * index_format::RecordSize(view.fields().size());
  sections.records = view.data_section().first(records);
  sections.keys = view.data_section().subspan(records, tables.keys_bytes);
  sections.pool = std::move(pool);
  sections.owners = std::move(owners);
  sections.counts = std::move(counts);
  std::vector<std::byte> out;
  index_format::VectorSink sink(out);
  ASSERT_TRUE(index_format::WriteIndex(tables, sections, sink).ok());
  WriteFile(path, std::string(reinterpret_cast<const char*>(out.data()), out.size()));
}

// Each restart table's first varint a byte longer than it needs (as another
// writer may store it): the same tables, other bytes.
void PadRestartVarints(const std::string& path) {
  RewriteRestartTables(path, [](const StoredTable& t) {
    std::vector<std::byte> encoded = t.shortest;
    std::size_t last = 0;  // the first varint's last byte
    while ((static_cast<std::uint8_t>(encoded[last]) & 0x80) != 0) ++last;
    encoded[last] |= std::byte{0x80};
    encoded.insert(encoded.begin() + static_cast<std::ptrdiff_t>(last) + 1, std::byte{0});
    return encoded;
  });
}

// Two packs of 4 seekable JPEGs each, at `out`/part-0 and `out`/part-1.
void PackSeekableParts(const TempDir& dir, const std::string& out) {
  for (int p = 0; p < 2; ++p) {
    for (int i = 0; i < 4; ++i)
      WriteFile(dir / ("src" + std::to_string(p) + "/" + (i % 2 ? "b" : "a") + "/p" + std::to_string(p) + "_" +
                       std::to_string(i) + ".jpg"),
                MakeJpeg(256, 192, static_cast<unsigned>(10 * p + i)));
    PackOptions pack;
    pack.seekable_jpeg = true;
    pack.target_shard_bytes = 20000;
    ASSERT_TRUE(Pack(dir / ("src" + std::to_string(p)), out + "/part-" + std::to_string(p), pack).ok());
  }
}

TEST(Merge, PartsReadAsOneDatasetWithTheirSamplesFieldsAndSeekableTables) {
  TempDir dir;
  const std::string out = dir / "data";
  // Two packs with seekable JPEGs (ImageFolder: classes a, b) and nothing else alike.
  PackSeekableParts(dir, out);
  ASSERT_OK_AND_ASSIGN(auto summary, MergeDatasets({out + "/part-0", out + "/part-1/index.stoker"}, out));
  EXPECT_EQ(summary.parts, 2u);
  EXPECT_EQ(summary.samples, 8u);
  EXPECT_EQ(summary.seekable_payloads, 8u);
  EXPECT_EQ(summary.class_names, (std::vector<std::string>{"a", "b"}));
  auto part0 = Open(out + "/part-0");
  auto part1 = Open(out + "/part-1");
  auto merged = Open(out);
  ASSERT_TRUE(part0 && part1 && merged);
  EXPECT_EQ(merged->num_samples(), 8u);
  EXPECT_EQ(merged->shards().size(), part0->shards().size() + part1->shards().size());
  EXPECT_EQ(merged->shards()[0].path, "part-0/shard-000000.tar");
  EXPECT_EQ(merged->class_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(merged->seekable_payloads(), 8u);
  EXPECT_TRUE(merged->has_region_records());
  ExpectPartIn(*part0, *merged, 0);
  ExpectPartIn(*part1, *merged, part0->num_samples());
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*merged));
  EXPECT_TRUE(report.ok()) << report.problems[0].message;
  EXPECT_EQ(report.shards_checked, merged->shards().size());
  // The seekable counts add up in the note; the parts' own indexes still open.
  EXPECT_NE(merged->pack_note().find("\"images_rewritten\":8"), std::string_view::npos) << merged->pack_note();
  EXPECT_EQ(Open(out + "/part-0")->num_samples(), 4u);
}

// The merge streams its index from the parts' own: one part's records, keys
// and restart tables come out byte for byte.
TEST(Merge, OnePartMergedCarriesItsRecordsKeysAndTablesByteForByte) {
  TempDir dir;
  const std::string out = dir / "data";
  PackSeekableParts(dir, out);
  ASSERT_OK_AND_ASSIGN(auto summary, MergeDatasets({out + "/part-1"}, out));
  EXPECT_EQ(summary.seekable_payloads, 4u);
  const std::string part_file = ReadFile(out + "/part-1/index.stoker"), merged_file = ReadFile(out + "/index.stoker");
  ASSERT_OK_AND_ASSIGN(auto part, index_format::IndexView::Open(std::as_bytes(std::span(part_file)), "part"));
  ASSERT_OK_AND_ASSIGN(auto merged, index_format::IndexView::Open(std::as_bytes(std::span(merged_file)), "merged"));
  ASSERT_EQ(merged.num_samples(), part.num_samples());
  std::uint64_t keys = 0;
  for (std::uint64_t i = 0; i < part.num_samples(); ++i) keys += part.record(i)->key.size();
  const std::uint64_t records_and_keys = part.num_samples() * index_format::RecordSize(part.fields().size()) + keys;
  EXPECT_TRUE(
      std::ranges::equal(merged.data_section().first(records_and_keys), part.data_section().first(records_and_keys)));
  ASSERT_EQ(merged.num_restart_tables(), part.num_restart_tables());
  for (std::uint64_t e = 0; e < part.num_restart_tables(); ++e) {
    const StoredTable a = ReadStoredTable(part, e), b = ReadStoredTable(merged, e);
    EXPECT_FALSE(a.stored.empty());
    EXPECT_TRUE(std::ranges::equal(a.stored, b.stored)) << "entry " << e;
  }
  EXPECT_EQ(merged.fields()[0].samples, part.fields()[0].samples);
}

// Restart tables another writer stored with longer varints than needed are
// read as the same tables and merged in the shortest form.
TEST(Merge, TablesStoredWithLongerVarintsMergeAsTheSameTables) {
  TempDir dir;
  const std::string out = dir / "data";
  PackSeekableParts(dir, out);
  const auto before = Open(out + "/part-1");
  ASSERT_TRUE(before);
  std::vector<std::vector<std::uint32_t>> tables(before->num_samples());
  const auto jpg = *before->FieldIndex("jpg");
  for (std::uint64_t i = 0; i < before->num_samples(); ++i) ASSERT_TRUE(before->RestartTable(i, jpg, tables[i]));
  const auto size_before = std::filesystem::file_size(out + "/part-1/index.stoker");
  PadRestartVarints(out + "/part-1/index.stoker");
  EXPECT_EQ(std::filesystem::file_size(out + "/part-1/index.stoker"), size_before + before->num_samples());
  auto part1 = Open(out + "/part-1");
  ASSERT_TRUE(part1);
  for (std::uint64_t i = 0; i < part1->num_samples(); ++i) {
    std::vector<std::uint32_t> table;
    ASSERT_TRUE(part1->RestartTable(i, jpg, table));
    EXPECT_EQ(table, tables[i]);
  }
  ASSERT_OK_AND_ASSIGN(auto summary, MergeDatasets({out + "/part-0", out + "/part-1"}, out));
  EXPECT_EQ(summary.seekable_payloads, 8u);
  auto merged = Open(out);
  ASSERT_TRUE(merged);
  ExpectPartIn(*Open(out + "/part-0"), *merged, 0);
  ExpectPartIn(*part1, *merged, 4);
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*merged));
  EXPECT_TRUE(report.ok()) << report.problems[0].message;
  // Shortest form: the merged index is the two parts' tables as packed.
  const std::string merged_file = ReadFile(out + "/index.stoker");
  ASSERT_OK_AND_ASSIGN(auto view, index_format::IndexView::Open(std::as_bytes(std::span(merged_file)), "merged"));
  for (std::uint64_t e = 0; e < view.num_restart_tables(); ++e) {
    const StoredTable t = ReadStoredTable(view, e);
    EXPECT_TRUE(std::ranges::equal(t.stored, t.shortest)) << "entry " << e;
  }
}

// A version-7 part whose region record does not read (its MCU height is not
// a JPEG's) is refused as damaged, naming the sample.
TEST(Merge, APartWhoseRegionRecordIsDamagedIsRefusedAsSuch) {
  TempDir dir;
  const std::string out = dir / "data";
  PackSeekableParts(dir, out);
  RewriteRestartTables(out + "/part-1/index.stoker", [](const StoredTable& t) {
    RegionRecord region = t.region;
    region.geometry.mcu_height = 7;
    std::vector<std::byte> encoded;
    index_format::AppendRestartTable(t.table, region, encoded);
    return encoded;
  });
  auto merged = MergeDatasets({out + "/part-0", out + "/part-1"}, out);
  ASSERT_FALSE(merged.ok());
  EXPECT_EQ(merged.error().code(), StatusCode::kCorruption);
  EXPECT_NE(merged.error().message().find("part-1/index.stoker: sample 'a/p1_0': its seekable JPEG's region record "
                                          "is damaged"),
            std::string::npos)
      << merged.error().message();
  EXPECT_FALSE(std::filesystem::exists(out + "/index.stoker"));
}

TEST(Merge, FieldsAreUnitedAndTheirKindsWidenAcrossParts) {
  TempDir dir;
  const std::string out = dir / "data";
  WritePart(out + "/a", "a", 5, FieldKind::kInt);
  WritePart(out + "/b", "b", 3, FieldKind::kFloat);
  {  // a third part without a score
    auto writer = DatasetWriter::Create(out + "/c", {});
    ASSERT_TRUE(writer.ok());
    const SampleField fields[] = {{"txt", Bytes("only text"), FieldKind::kText}};
    ASSERT_TRUE((*writer)->Add("c0", fields).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
  }
  ASSERT_OK_AND_ASSIGN(auto summary, MergeDatasets({out + "/a/", out + "/./b", out + "/c"}, out + "/"));
  EXPECT_EQ(summary.samples, 9u);
  auto merged = Open(out);
  ASSERT_TRUE(merged);
  const auto score = *merged->FieldIndex("score");
  EXPECT_EQ(merged->recorded_field(score).kind, FieldKind::kFloat);
  EXPECT_EQ(merged->recorded_field(score).samples, 8u);
  EXPECT_EQ(merged->recorded_field(*merged->FieldIndex("txt")).samples, 9u);
  auto last = merged->Sample(8);
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(last->key, "c0");
  EXPECT_FALSE(last->fields[score].has_value());
  EXPECT_EQ(last->label, kNoLabel);
  ExpectPartIn(*Open(out + "/b"), *merged, 5);
  // Class names: a and b name theirs alike; c names none.
  EXPECT_EQ(merged->class_names(), (std::vector<std::string>{"cat", "dog"}));
  ASSERT_OK_AND_ASSIGN(auto report, Verify(*merged));
  EXPECT_TRUE(report.ok());
}

// The CLI's bar for the writing half of a large merge: told the bytes
// written against the index's size, ending at it; the index is the same.
TEST(Merge, WritingTheIndexReportsItsProgressUpToItsSize) {
  TempDir dir;
  const std::string out = dir / "data";
  WritePart(out + "/a", "a", 40, FieldKind::kInt);
  WritePart(out + "/b", "b", 30, FieldKind::kFloat);
  ASSERT_OK(MergeDatasets({out + "/a", out + "/b"}, out).status());
  const std::string quiet = ReadFile(out + "/index.stoker");
  std::vector<std::pair<std::uint64_t, std::uint64_t>> told;
  std::uint64_t parts_told = 0;
  MergeOptions options;
  options.overwrite = true;
  options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
    EXPECT_EQ(total, 2u);
    parts_told = done;
  };
  options.on_write_progress = [&](std::uint64_t written, std::uint64_t total) {
    EXPECT_EQ(parts_told, 2u) << "the parts are scanned first";
    told.emplace_back(written, total);
  };
  ASSERT_OK(MergeDatasets({out + "/a", out + "/b"}, out, options).status());
  EXPECT_EQ(ReadFile(out + "/index.stoker"), quiet);
  ASSERT_FALSE(told.empty());
  EXPECT_EQ(told.back(), std::make_pair(std::uint64_t{quiet.size()}, std::uint64_t{quiet.size()}));
  for (std::size_t i = 1; i < told.size(); ++i) EXPECT_LE(told[i - 1].first, told[i].first);
}

TEST(Merge, RefusesWhatWouldMakeTheMergedDatasetWrongAndNamesIt) {
  TempDir dir;
  const std::string out = dir / "data";
  WritePart(out + "/a", "a", 3, FieldKind::kInt);
  WritePart(out + "/b", "b", 3, FieldKind::kInt);
  const auto refused = [&](const std::vector<std::string>& parts, const std::string& output,
                           MergeOptions options = {}) {
    const std::string index = output + "/index.stoker";
    const std::string before = std::filesystem::exists(index) ? ReadFile(index) : "";
    auto r = MergeDatasets(parts, output, options);
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(std::filesystem::exists(index) ? ReadFile(index) : "", before) << "nothing is written when refused";
    return r.ok() ? std::string() : r.error().message();
  };
  EXPECT_NE(refused({}, out).find("no parts"), std::string::npos);
  // A key in two parts (each worker numbering from 0).
  WritePart(out + "/a2", "a", 2, FieldKind::kInt);
  std::string message = refused({out + "/a", out + "/b", out + "/a2"}, out);
  EXPECT_NE(message.find("sample key 'a0'"), std::string::npos) << message;
  EXPECT_NE(message.find(out + "/a2"), std::string::npos) << message;
  // Class names that differ: labels would mean different classes.
  WritePart(out + "/d", "d", 2, FieldKind::kInt, {"cat", "emu"});
  message = refused({out + "/a", out + "/d"}, out);
  EXPECT_NE(message.find("label 1 is \"dog\" against \"emu\""), std::string::npos) << message;
  // Parts outside the output folder, the output folder itself, a part given twice, a missing one.
  WritePart(dir / "elsewhere", "e", 2, FieldKind::kInt);
  message = refused({out + "/a", dir / "elsewhere"}, out);
  EXPECT_NE(message.find("not inside the output folder"), std::string::npos) << message;
  message = refused({out + "/a"}, out + "/a");
  EXPECT_NE(message.find("the output folder itself"), std::string::npos) << message;
  message = refused({out + "/a", out + "/b/../a"}, out);
  EXPECT_NE(message.find("given twice"), std::string::npos) << message;
  message = refused({out + "/a", out + "/missing"}, out);
  EXPECT_NE(message.find(out + "/missing"), std::string::npos) << message;
  // A shard two parts name (an index copied beside its own).
  std::filesystem::create_directories(out + "/copy");
  WriteFile(out + "/copy/index.stoker", ReadFile(out + "/a/index.stoker"));
  message = refused({out + "/a", out + "/copy"}, out);
  EXPECT_NE(message.find("is in part"), std::string::npos) << message;
  // A part whose index is damaged (a label's byte): its records would be copied under a new checksum.
  std::string bytes = ReadFile(out + "/b/index.stoker");
  bytes[bytes.size() - 40] ^= 1;
  WriteFile(out + "/b/index.stoker", bytes);
  message = refused({out + "/a", out + "/b"}, out);
  EXPECT_NE(message.find("data checksum"), std::string::npos) << message;
  bytes[bytes.size() - 40] ^= 1;
  WriteFile(out + "/b/index.stoker", bytes);
  // An index in the output folder is replaced only when asked.
  ASSERT_TRUE(MergeDatasets({out + "/a", out + "/b"}, out).ok());
  auto again = MergeDatasets({out + "/a"}, out);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), StatusCode::kAlreadyExists);
  MergeOptions overwrite;
  overwrite.overwrite = true;
  ASSERT_OK_AND_ASSIGN(auto summary, MergeDatasets({out + "/a"}, out, overwrite));
  EXPECT_EQ(summary.samples, 3u);
}

}  // namespace
}  // namespace stoker
