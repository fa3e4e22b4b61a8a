// Writing an index file section by section, so that no writer holds the
// whole file in memory: the writer describes the file's tables up front
// (IndexTables) and gives its per-sample sections through IndexSections,
// which may be asked for them twice (the header holds the checksum of the
// sections, so they are hashed before anything is written). IndexBuilder
// writes through it from its own tables; `stoker merge` from the parts'
// mapped indexes, so a merge of tens of millions of samples needs memory
// for their shards, fields and one hash per key, not for the index. Layout
// in docs/format.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "format/index_format.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::index_format {

// Where an index's bytes go (a file, a vector, a hash).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  [[nodiscard]] virtual Status Write(std::span<const std::byte> bytes) = 0;
  // Told before the first Write how many bytes will come.
  virtual void Expect(std::uint64_t /*bytes*/) {}
};

// Appends to a vector.
class VectorSink final : public ByteSink {
 public:
  explicit VectorSink(std::vector<std::byte>& out) : out_(&out) {}
  void Expect(std::uint64_t bytes) override { out_->reserve(out_->size() + bytes); }
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override {
    out_->insert(out_->end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }

 private:
  std::vector<std::byte>* out_;
};

// Where IndexBuilder keeps what it gathers per sample (records, keys,
// restart tables) until the index is written: in memory, or in scratch
// files (dataset/index_file.h) for packs whose samples would not fit
// (records and keys: about 100 bytes a sample; restart tables about 0.5-1 KB
// an image).
class ByteStore {
 public:
  virtual ~ByteStore() = default;
  // An error leaves the store, and the index it is for, unusable.
  [[nodiscard]] virtual Status Append(std::span<const std::byte> bytes) = 0;
  [[nodiscard]] virtual std::uint64_t size() const = 0;
  // Everything appended, in order, to `out`; as often as asked.
  [[nodiscard]] virtual Status WriteTo(ByteSink& out) const = 0;
  // The bytes appended at [offset, offset + out.size()); Internal past the end.
  [[nodiscard]] virtual Status ReadAt(std::uint64_t offset, std::span<std::byte> out) const = 0;
};

class MemoryByteStore final : public ByteStore {
 public:
  [[nodiscard]] Status Append(std::span<const std::byte> bytes) override {
    bytes_.insert(bytes_.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }
  [[nodiscard]] std::uint64_t size() const override { return bytes_.size(); }
  [[nodiscard]] Status WriteTo(ByteSink& out) const override { return out.Write(bytes_); }
  [[nodiscard]] Status ReadAt(std::uint64_t offset, std::span<std::byte> out) const override;

 private:
  std::vector<std::byte> bytes_;
};

// Everything of an index but its per-sample sections.
struct IndexTables {
  // Sorted by name, with kind, samples and bytes (FieldEntry::has_stats is
  // not read: an index is written at the newest version).
  std::vector<FieldEntry> fields;
  // In order; each one's first_sample and num_samples follow the one before.
  std::vector<ShardEntry> shards;
  std::uint64_t num_samples = 0;
  std::uint64_t keys_bytes = 0;
  std::uint64_t skipped_members = 0;
  std::string note;  // empty: none
  std::uint64_t restart_entries = 0;
  std::uint64_t restart_pool_bytes = 0;
};

// The per-sample sections of an index, each written whole and in order when
// asked, as often as asked, and the same each time.
class IndexSections {
 public:
  virtual ~IndexSections() = default;
  // num_samples records of RecordSize(fields) bytes (EncodeRecord).
  [[nodiscard]] virtual Status WriteRecords(ByteSink& out) = 0;
  // keys_bytes: the keys the records' offsets name.
  [[nodiscard]] virtual Status WriteKeys(ByteSink& out) = 0;
  // restart_entries entries (EncodeRestartEntry), sorted by (sample, field).
  [[nodiscard]] virtual Status WriteRestartEntries(ByteSink& out) = 0;
  // restart_pool_bytes: the entries' tables (AppendRestartTable), in their order.
  [[nodiscard]] virtual Status WriteRestartPool(ByteSink& out) = 0;
};

// Writes the index `tables` and `sections` describe to `out`, small writes
// gathered into large ones. Refuses tables past the format's limits (shards,
// fields, the note's size) before writing anything, a section whose size
// differs from what `tables` says (Internal), and sections that wrote other
// bytes the second time than the first (Unavailable: the header's checksum
// would not match them; the caller must not keep what `out` got).
[[nodiscard]] Status WriteIndex(const IndexTables& tables, IndexSections& sections, ByteSink& out);

[[nodiscard]] constexpr std::uint32_t RecordSize(std::size_t num_fields) {
  return kRecordBaseSize + kFieldSlotSize * static_cast<std::uint32_t>(num_fields);
}

// A record of RecordSize(num_fields) bytes at `record`, every field absent.
void EncodeRecord(std::byte* record, std::uint32_t shard, std::uint32_t key_size, std::uint64_t key_offset,
                  std::int64_t label, std::uint64_t checksum, std::size_t num_fields);
// Field `field`'s range in a record EncodeRecord wrote.
void EncodeFieldSlot(std::byte* record, std::uint32_t field, std::uint64_t offset, std::uint64_t size);
// A restart entry (kRestartEntrySize bytes): sample `sample`'s field `field`
// (field-table order) has a table of `offsets` offsets at `pool_offset` in the pool.
void EncodeRestartEntry(std::byte* entry, std::uint64_t sample, std::uint32_t field, std::uint32_t offsets,
                        std::uint64_t pool_offset);
// A restart table as the pool keeps it: its varints, then `region`.
void AppendRestartTable(std::span<const std::uint32_t> table, const RegionRecord& region, std::vector<std::byte>& out);

// The kind of a field whose samples say `a` and `b` (see IndexBuilder::Field).
[[nodiscard]] std::uint8_t WidenKind(std::uint8_t a, std::uint8_t b);

}  // namespace stoker::index_format
