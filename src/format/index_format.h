// The dataset index: an mmap-able file that locates every sample of a
// dataset in its shards. Layout in docs/format.md. Pure functions over bytes.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/fields.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::index_format {

inline constexpr char kMagic[8] = {'S', 'T', 'K', 'I', 'N', 'D', 'E', 'X'};
// Version 2 adds the count of tar members left out (header offset 120, which
// version 1 kept zero). Version 3 adds the note section after the keys
// (header flag kFlagNote): what `stoker pack` did to the samples, as JSON.
// Version 4 widens the field table's entries to 32 bytes: each field's kind
// (what its bytes are), how many samples have it and their total size.
// Version 5 adds the restart section after the note (header flag
// kFlagRestarts): where each restart interval of a seekable JPEG starts, as
// u32s. Version 6 keeps each table as LEB128 varints instead: its first
// offset, then each offset's difference from the one before (about 2 bytes
// an interval where version 5 took 4). Version 7 follows each table with
// its region record (RegionRecord): the image's size and MCU height, so a
// reader can plan a crop before reading, and a check of each MCU row's
// bytes and of the rest of the sample, so it can verify a read of only the
// rows the crop covers. Writers write version 7 when there is a restart
// section, else 4; readers take 1-7.
inline constexpr std::uint32_t kVersion = 7;
inline constexpr std::uint32_t kVersionWithoutRestarts = 4;
inline constexpr std::uint32_t kVersionWithFieldStats = 4;
inline constexpr std::uint32_t kVersionWithRestarts = 5;
inline constexpr std::uint32_t kVersionWithVarintRestarts = 6;
inline constexpr std::uint32_t kVersionWithRegionRecords = 7;
inline constexpr std::uint32_t kFlagNote = 1;
inline constexpr std::uint32_t kFlagRestarts = 2;
inline constexpr std::uint32_t kRestartEntrySize = 24;
inline constexpr std::uint64_t kMaxNoteBytes = 1 << 20;
inline constexpr std::uint32_t kOldestVersion = 1;
inline constexpr std::uint32_t kHeaderSize = 128;
inline constexpr std::uint32_t kFieldEntrySizeV1 = 16;  // versions 1-3
inline constexpr std::uint32_t kFieldEntrySize = 32;    // version 4
inline constexpr std::uint32_t kShardEntrySize = 48;
inline constexpr std::uint32_t kRecordBaseSize = 32;
inline constexpr std::uint32_t kFieldSlotSize = 16;
inline constexpr std::uint64_t kAbsent = ~std::uint64_t{0};  // field offset of a missing field
inline constexpr std::int64_t kNoLabel = INT64_MIN;
// Limits that keep a hostile index from asking for absurd work.
inline constexpr std::uint32_t kMaxFields = 4096;
inline constexpr std::uint32_t kMaxShards = 1u << 24;

static_assert(std::endian::native == std::endian::little, "the index format is little-endian");

// Header field offsets.
namespace header {
inline constexpr std::size_t kMagicOff = 0, kVersionOff = 8, kHeaderSizeOff = 12, kFileSizeOff = 16,
                             kNumSamplesOff = 24, kNumFieldsOff = 32, kNumShardsOff = 36, kRecordSizeOff = 40,
                             kFlagsOff = 44, kFieldsOff = 48, kShardsOff = 56, kStringsOff = 64, kStringsSizeOff = 72,
                             kRecordsOff = 80, kKeysOff = 88, kKeysSizeOff = 96, kMetaChecksumOff = 104,
                             kDataChecksumOff = 112, kSkippedMembersOff = 120;
}

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

struct ShardEntry {
  std::string path;  // relative to the index file's directory, or absolute
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxh3-64 of the whole shard file
  std::uint64_t first_sample = 0;
  std::uint64_t num_samples = 0;
};

// What a field's bytes are, as the writer knew it (version 4): the value of
// stoker::FieldKind plus one, so that 0 reads as "not recorded" (older
// indexes; readers then go by the name's convention).
inline constexpr std::uint8_t kKindNotRecorded = 0;
inline constexpr std::uint8_t kMaxKindCode = 8;
constexpr std::uint8_t KindCode(FieldKind kind) {
  return static_cast<std::uint8_t>(static_cast<std::uint8_t>(kind) + 1);
}

// One field of the index: its name and, from version 4, its kind and how
// many samples have it.
struct FieldEntry {
  std::string name;
  std::uint8_t kind = kKindNotRecorded;
  std::uint64_t samples = 0;  // version 4: samples that have the field
  std::uint64_t bytes = 0;    // version 4: their payloads' total size
  bool has_stats = false;     // false for versions 1-3
};

struct FieldRange {
  std::uint64_t offset = kAbsent;  // byte offset of the member's data in the shard
  std::uint64_t size = 0;
  [[nodiscard]] bool present() const { return offset != kAbsent; }
};

// xxh3-64 of the header and tables (`meta` = bytes [0, records offset)) with
// the meta-checksum field itself read as zero.
[[nodiscard]] std::uint64_t MetaChecksum(std::span<const std::byte> meta);

// A validated, zero-copy view of an index held in memory. Open() checks the
// header, tables and meta checksum in time independent of the sample count;
// per-sample records are checked when they are read.
class IndexView {
 public:
  // `where` names the index in error messages (usually its path).
  [[nodiscard]] static Result<IndexView> Open(std::span<const std::byte> bytes, std::string where);

  [[nodiscard]] std::uint64_t num_samples() const { return num_samples_; }
  [[nodiscard]] const std::vector<std::string>& field_names() const { return field_names_; }
  [[nodiscard]] const std::vector<FieldEntry>& fields() const { return fields_; }
  [[nodiscard]] const std::vector<ShardEntry>& shards() const { return shards_; }
  [[nodiscard]] std::uint64_t data_checksum() const { return data_checksum_; }
  // Tar members the indexer left out as WebDataset does (version 2).
  [[nodiscard]] std::uint64_t skipped_members() const { return skipped_members_; }
  // What the packer did to the samples, as JSON (version 3); empty if nothing.
  [[nodiscard]] std::string_view note() const { return note_; }
  [[nodiscard]] std::span<const std::byte> data_section() const { return bytes_.subspan(records_offset_); }
  // How many (sample, field) payloads have a restart table (version 5-7).
  [[nodiscard]] std::uint64_t num_restart_tables() const { return restart_entries_; }
  // The restart table of sample `sample`'s field `field` (field-table
  // order) into `table`: intervals + 1 offsets from the payload's start.
  // False (and `table` empty) when the index records none or its entry is
  // damaged; never a wild read. Readers check a table against the payload
  // before trusting it. With `region` (version 7): its region record too,
  // cleared (rows() == 0) when the index has none or it does not fit the
  // table.
  [[nodiscard]] bool restart_table(std::uint64_t sample, std::uint32_t field, std::vector<std::uint32_t>& table,
                                   RegionRecord* region = nullptr) const;
  // Entry `entry` (< num_restart_tables()) of the restart section, in its
  // order (by sample, then field): whose table it is, and the table as
  // restart_table() gives it. False when the entry is damaged.
  [[nodiscard]] bool restart_table_at(std::uint64_t entry, std::uint64_t* sample, std::uint32_t* field,
                                      std::vector<std::uint32_t>& table, RegionRecord* region = nullptr) const;
  // As restart_table_at, and the bytes the table and its region record take
  // in the section (versions 6-7, with a region record read; else empty).
  [[nodiscard]] bool restart_table_at(std::uint64_t entry, std::uint64_t* sample, std::uint32_t* field,
                                      std::vector<std::uint32_t>& table, RegionRecord& region,
                                      std::span<const std::byte>& stored) const;
  // `size` bytes of the section from where entry `entry`'s table starts
  // (versions 6-7): the bytes `stored` named when restart_table_at read it.
  // Empty when they run past the section.
  [[nodiscard]] std::span<const std::byte> restart_table_bytes(std::uint64_t entry, std::size_t size) const;
  // Whose table entry `entry` (< num_restart_tables()) is, and how many
  // offsets it says it has, without reading the table.
  void restart_entry_owner(std::uint64_t entry, std::uint64_t* sample, std::uint32_t* field,
                           std::uint32_t* offsets) const {
    const std::byte* e = restart_section_ + entry * kRestartEntrySize;
    *sample = Load<std::uint64_t>(e);
    *field = Load<std::uint32_t>(e + 8);
    if (offsets != nullptr) *offsets = Load<std::uint32_t>(e + 12);
  }
  [[nodiscard]] const std::string& where() const { return where_; }
  // Whether tables carry region records (version 7).
  [[nodiscard]] bool has_region_records() const { return region_records_ && restart_entries_ > 0; }

  struct Record {
    std::uint32_t shard = 0;
    std::string_view key;
    std::int64_t label = kNoLabel;
    std::uint64_t checksum = 0;
    const std::byte* fields = nullptr;  // num_fields slots
    [[nodiscard]] FieldRange field(std::size_t i) const {
      return {Load<std::uint64_t>(fields + i * kFieldSlotSize), Load<std::uint64_t>(fields + i * kFieldSlotSize + 8)};
    }
  };
  // Reads and validates record `i` (shard id, key bounds and no NUL in the
  // key, field ranges inside the shard, sample inside its shard's range).
  [[nodiscard]] Result<Record> record(std::uint64_t i) const;

 private:
  std::span<const std::byte> bytes_;
  std::string where_;
  std::uint64_t num_samples_ = 0;
  std::uint32_t record_size_ = 0;
  std::uint64_t records_offset_ = 0;
  std::uint64_t keys_offset_ = 0;
  std::uint64_t keys_size_ = 0;
  std::uint64_t data_checksum_ = 0;
  std::uint64_t skipped_members_ = 0;
  std::string_view note_;
  // `bytes` follow a table's varints: its region record into `region`,
  // left cleared when it does not fit `table` or runs past the pool.
  // Returns the bytes it took (0: none read).
  static std::size_t ReadRegionRecord(std::span<const std::byte> bytes, std::span<const std::uint32_t> table,
                                      RegionRecord& region);
  [[nodiscard]] bool ReadRestartEntry(std::uint64_t entry, std::vector<std::uint32_t>& table, RegionRecord* region,
                                      std::span<const std::byte>* stored = nullptr) const;
  std::uint64_t restart_entries_ = 0;           // entries of the restart section
  std::uint64_t restart_pool_ = 0;              // after them: u32 offsets (version 5) or varint bytes (6)
  bool restart_varints_ = false;                // version 6
  bool region_records_ = false;                 // version 7: each table followed by its region record
  const std::byte* restart_section_ = nullptr;  // the first entry
  std::vector<std::string> field_names_;
  std::vector<FieldEntry> fields_;
  std::vector<ShardEntry> shards_;
};

// A restart table as version 6 keeps it (LEB128: 7 bits a byte, low first,
// the high bit set on all but a value's last byte): the first offset, then
// each difference from the one before. `table` must not decrease.
void AppendRestartVarints(std::span<const std::uint32_t> table, std::vector<std::byte>& out);
// Reads `count` values so written from `bytes` into `table` (replacing its
// contents). False when they run past the end, a varint takes more than 5
// bytes or does not fit 32 bits, or an offset does not.
[[nodiscard]] bool ReadRestartVarints(std::span<const std::byte> bytes, std::uint32_t count,
                                      std::vector<std::uint32_t>& table, std::size_t* used = nullptr);

// The MCU rows of an image of `geometry` (its region record's row checks),
// or 0 when it is not a JPEG's geometry (sides up to 65535, MCU rows of 8,
// 16, 24 or 32 px).
[[nodiscard]] std::uint32_t RegionRows(const JpegGeometry& geometry);

// 32 bits of a piece's xxh3-64: what a region record keeps per piece.
[[nodiscard]] std::uint32_t PieceCheck(std::span<const std::byte> bytes);

// Checks the pieces of a seekable JPEG payload of `payload_size` bytes with
// restart table `table` and region record `region`, as read in part: `head`
// its bytes before the first interval, `rows` those of MCU rows [first_row,
// first_row + n) (n from their size), `others` the sample's other fields'
// payloads in field-name order. False when a piece differs from its check
// or the pieces do not fit the table.
[[nodiscard]] bool RegionPiecesAgree(const RegionRecord& region, std::span<const std::uint32_t> table,
                                     std::uint64_t payload_size, std::span<const std::span<const std::byte>> others,
                                     std::span<const std::byte> head, std::uint32_t first_row,
                                     std::span<const std::byte> rows);

class ByteSink;   // format/index_writer.h
class ByteStore;  // format/index_writer.h

// Builds an index from samples added one by one. Samples must arrive
// grouped by shard, in shard order. Field ids are assigned by first
// appearance and sorted by name at Finish(), so output is a pure function
// of the input. What each sample brings (its record, key and restart
// tables) waits in ByteStores, memory unless set, so that a pack of tens of
// millions of samples can keep it in scratch files: the builder itself
// holds about 2 bytes a sample (its key's length), plus its fields and
// shards.
class IndexBuilder {
 public:
  IndexBuilder();
  ~IndexBuilder();
  IndexBuilder(IndexBuilder&&) noexcept;
  IndexBuilder& operator=(IndexBuilder&&) noexcept;

  struct Field {
    std::string_view name;
    std::uint64_t offset;
    std::uint64_t size;
    // What the bytes are (kind code, see kKindNotRecorded). Samples that
    // disagree widen the field's kind: int and float make float, numbers
    // and text make text, any other mix makes bytes.
    std::uint8_t kind = kKindNotRecorded;
    // A seekable JPEG's restart table (intervals + 1 offsets from the
    // payload's start, not decreasing); empty for none. With one, `geometry`
    // and `payload` (the field's bytes) make its region record.
    std::span<const std::uint32_t> restarts = {};
    JpegGeometry geometry = {};
    std::span<const std::byte> payload = {};
    // Instead of `payload` (and the other fields' payloads): a region
    // record made before, for this table and geometry, kept as it is (an
    // index merged from others, which never reads the shards).
    const RegionRecord* region = nullptr;
  };
  // Where the samples' records (with their restart entries), keys and
  // restart tables wait until the index is written. Set them before the
  // first sample; a null one stays in memory.
  struct Stores {
    std::unique_ptr<ByteStore> records, keys, restart_tables;
  };
  void SetStores(Stores stores);
  // Returns the shard id.
  std::uint32_t AddShard(std::string path);
  // Sets the size and checksum of a shard once it is complete.
  void SetShardContents(std::uint32_t shard, std::uint64_t size, std::uint64_t checksum);
  // Each field's kind code is merged over its samples (see Field::kind).
  // An error from a store leaves the builder unusable.
  [[nodiscard]] Status AddSample(std::uint32_t shard, std::string_view key, std::int64_t label, std::uint64_t checksum,
                                 std::span<const Field> fields);
  [[nodiscard]] std::uint64_t num_samples() const { return num_samples_; }
  // The key of sample `i` (< num_samples()), read back from the keys' store.
  [[nodiscard]] Result<std::string> Key(std::uint64_t i) const;
  // Tar members left out of the shards' samples (recorded in the header).
  void SetSkippedMembers(std::uint64_t count) { skipped_members_ = count; }
  // A note for readers (JSON, at most kMaxNoteBytes); none when empty.
  void SetNote(std::string note) { note_ = std::move(note); }
  // Serialises the whole index into memory.
  [[nodiscard]] Result<std::vector<std::byte>> Finish() const;
  // Writes it to `out` (a file) without a copy of it in memory.
  [[nodiscard]] Status FinishTo(ByteSink& out) const;

 private:
  std::vector<ShardEntry> shards_;
  struct FieldTotals {
    std::uint8_t kind = kKindNotRecorded;
    bool kind_set = false;
    std::uint64_t samples = 0, bytes = 0;
  };
  std::vector<std::string> field_names_;   // by id
  std::vector<FieldTotals> field_totals_;  // by id
  class Sections;
  // Field `i`'s region record (version 7): as given, or made from the payloads.
  static RegionRecord MakeRegionRecord(std::span<const Field> fields, std::size_t i);
  [[nodiscard]] std::uint64_t KeyLength(std::uint64_t i) const;

  // Each sample's raw record (index_builder.cc: RawRecord) in records_,
  // its key in keys_, its restart tables (in field-name order, the index's)
  // in restart_tables_.
  Stores stores_;
  std::uint64_t num_samples_ = 0;
  std::uint64_t restart_entries_ = 0;
  // To find a key again: each key's length (kLongKey: in long_key_lengths_)
  // and every kKeyStride-th key's offset.
  static constexpr std::uint16_t kLongKey = 0xFFFF;
  static constexpr std::uint64_t kKeyStride = 64;
  std::vector<std::uint16_t> key_lengths_;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> long_key_lengths_;  // (sample, length), by sample
  std::vector<std::uint64_t> key_offsets_;                                 // of samples 0, kKeyStride, ...
  std::vector<std::byte> record_scratch_, restart_scratch_;                // a sample's, encoded
  std::uint64_t skipped_members_ = 0;
  std::string note_;
};

}  // namespace stoker::index_format
