#include "format/index_writer.h"

#include <cstring>

#include <fmt/format.h>

#include "core/hash.h"
#include "stoker/fields.h"

namespace stoker::index_format {
namespace {

template <typename T>
void Store(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

template <typename T>
std::span<const std::byte> BytesOf(const T& v) {
  return std::as_bytes(std::span<const T, 1>(&v, 1));
}

// Gathers small writes (a record is 64 bytes) into blocks, and counts them.
class GatheringSink final : public ByteSink {
 public:
  explicit GatheringSink(ByteSink& out) : out_(&out) { block_.reserve(kBlockBytes); }
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override {
    written_ += bytes.size();
    if (block_.size() + bytes.size() > kBlockBytes) STOKER_RETURN_IF_ERROR(Flush());
    if (bytes.size() >= kBlockBytes) return out_->Write(bytes);
    block_.insert(block_.end(), bytes.begin(), bytes.end());
    return Status::Ok();
  }
  [[nodiscard]] Status Flush() {
    if (block_.empty()) return Status::Ok();
    Status s = out_->Write(block_);
    block_.clear();
    return s;
  }
  [[nodiscard]] std::uint64_t written() const { return written_; }

 private:
  static constexpr std::size_t kBlockBytes = std::size_t{1} << 20;
  ByteSink* out_;
  std::vector<std::byte> block_;
  std::uint64_t written_ = 0;
};

// Hashes what it is given, and passes it on to `next` when there is one.
class HashSink final : public ByteSink {
 public:
  explicit HashSink(ByteSink* next = nullptr) : next_(next) {}
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override {
    hash_.Update(bytes);
    return next_ != nullptr ? next_->Write(bytes) : Status::Ok();
  }
  [[nodiscard]] std::uint64_t Digest() const { return hash_.Digest(); }

 private:
  ByteSink* next_;
  Xxh3Stream hash_;
};

// Everything from the records on: records, keys, the note, the restart section.
Status WriteData(const IndexTables& tables, IndexSections& sections, ByteSink& sink) {
  GatheringSink out(sink);
  const auto section = [&](std::string_view what, std::uint64_t expected, auto write) -> Status {
    const std::uint64_t before = out.written();
    STOKER_RETURN_IF_ERROR(write());
    const std::uint64_t size = out.written() - before;
    if (size != expected)
      return Status::Internal(
          fmt::format("index writer: the {} section is {} bytes where its tables say {}", what, size, expected));
    return Status::Ok();
  };
  STOKER_RETURN_IF_ERROR(section("record", tables.num_samples * RecordSize(tables.fields.size()),
                                 [&] { return sections.WriteRecords(out); }));
  STOKER_RETURN_IF_ERROR(section("key", tables.keys_bytes, [&] { return sections.WriteKeys(out); }));
  if (!tables.note.empty()) {
    const std::uint64_t size = tables.note.size();
    STOKER_RETURN_IF_ERROR(out.Write(BytesOf(size)));
    STOKER_RETURN_IF_ERROR(out.Write(std::as_bytes(std::span(tables.note))));
  }
  if (tables.restart_entries > 0) {
    STOKER_RETURN_IF_ERROR(out.Write(BytesOf(tables.restart_entries)));
    STOKER_RETURN_IF_ERROR(out.Write(BytesOf(tables.restart_pool_bytes)));
    STOKER_RETURN_IF_ERROR(section("restart entry", tables.restart_entries * kRestartEntrySize,
                                   [&] { return sections.WriteRestartEntries(out); }));
    STOKER_RETURN_IF_ERROR(
        section("restart pool", tables.restart_pool_bytes, [&] { return sections.WriteRestartPool(out); }));
  }
  return out.Flush();
}

}  // namespace

std::uint8_t WidenKind(std::uint8_t a, std::uint8_t b) {
  if (a == b) return a;
  if (a == kKindNotRecorded || b == kKindNotRecorded) return kKindNotRecorded;
  constexpr auto code = KindCode;
  const auto number = [](std::uint8_t k) { return k == code(FieldKind::kInt) || k == code(FieldKind::kFloat); };
  if (number(a) && number(b)) return code(FieldKind::kFloat);
  if ((number(a) || a == code(FieldKind::kText)) && (number(b) || b == code(FieldKind::kText)))
    return code(FieldKind::kText);
  // A number's text is JSON too (a JSON Lines column of numbers and objects).
  if ((number(a) || a == code(FieldKind::kJson)) && (number(b) || b == code(FieldKind::kJson)))
    return code(FieldKind::kJson);
  return code(FieldKind::kBytes);
}

Status MemoryByteStore::ReadAt(std::uint64_t offset, std::span<std::byte> out) const {
  if (offset > bytes_.size() || out.size() > bytes_.size() - offset)
    return Status::Internal(
        fmt::format("a read of {} bytes at {} past a store of {} bytes", out.size(), offset, bytes_.size()));
  if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  return Status::Ok();
}

void EncodeRecord(std::byte* record, std::uint32_t shard, std::uint32_t key_size, std::uint64_t key_offset,
                  std::int64_t label, std::uint64_t checksum, std::size_t num_fields) {
  Store<std::uint32_t>(record, shard);
  Store<std::uint32_t>(record + 4, key_size);
  Store<std::uint64_t>(record + 8, key_offset);
  Store<std::int64_t>(record + 16, label);
  Store<std::uint64_t>(record + 24, checksum);
  for (std::size_t f = 0; f < num_fields; ++f) {
    Store<std::uint64_t>(record + kRecordBaseSize + f * kFieldSlotSize, kAbsent);
    Store<std::uint64_t>(record + kRecordBaseSize + f * kFieldSlotSize + 8, 0);
  }
}

void EncodeFieldSlot(std::byte* record, std::uint32_t field, std::uint64_t offset, std::uint64_t size) {
  std::byte* slot = record + kRecordBaseSize + std::size_t{field} * kFieldSlotSize;
  Store<std::uint64_t>(slot, offset);
  Store<std::uint64_t>(slot + 8, size);
}

void EncodeRestartEntry(std::byte* entry, std::uint64_t sample, std::uint32_t field, std::uint32_t offsets,
                        std::uint64_t pool_offset) {
  Store<std::uint64_t>(entry, sample);
  Store<std::uint32_t>(entry + 8, field);
  Store<std::uint32_t>(entry + 12, offsets);
  Store<std::uint64_t>(entry + 16, pool_offset);
}

Status WriteIndex(const IndexTables& tables, IndexSections& sections, ByteSink& out) {
  const std::uint64_t num_fields = tables.fields.size(), num_shards = tables.shards.size();
  if (num_shards > kMaxShards) return Status::InvalidArgument(fmt::format("more than {} shards", kMaxShards));
  if (num_fields > kMaxFields)
    return Status::InvalidArgument(fmt::format("more than {} distinct field names", kMaxFields));
  if (tables.note.size() > kMaxNoteBytes)
    return Status::InvalidArgument(
        fmt::format("index note of {} bytes is over the limit {}", tables.note.size(), kMaxNoteBytes));
  if (tables.note.find('\0') != std::string::npos) return Status::InvalidArgument("index note contains a NUL byte");
  std::uint64_t next_sample = 0;
  for (const ShardEntry& shard : tables.shards) {
    if (shard.first_sample != next_sample)
      return Status::Internal(
          fmt::format("index writer: shard '{}' starts at sample {} where the one before ends at {}", shard.path,
                      shard.first_sample, next_sample));
    next_sample += shard.num_samples;
  }
  if (next_sample != tables.num_samples)
    return Status::Internal(fmt::format("index writer: the shards hold {} samples where the tables say {}", next_sample,
                                        tables.num_samples));

  std::string strings;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> field_strings, shard_strings;
  for (const FieldEntry& field : tables.fields) {
    field_strings.emplace_back(strings.size(), static_cast<std::uint32_t>(field.name.size()));
    strings += field.name;
  }
  for (const ShardEntry& shard : tables.shards) {
    shard_strings.emplace_back(strings.size(), static_cast<std::uint32_t>(shard.path.size()));
    strings += shard.path;
  }
  const std::uint32_t record_size = RecordSize(num_fields);
  const std::uint64_t fields_off = kHeaderSize;
  const std::uint64_t shards_off = fields_off + kFieldEntrySize * num_fields;
  const std::uint64_t strings_off = shards_off + kShardEntrySize * num_shards;
  const std::uint64_t records_off = (strings_off + strings.size() + 7) / 8 * 8;
  const std::uint64_t keys_off = records_off + std::uint64_t{record_size} * tables.num_samples;
  const std::uint64_t note_off = keys_off + tables.keys_bytes;
  const std::uint64_t restarts_off = note_off + (tables.note.empty() ? 0 : 8 + tables.note.size());
  const std::uint64_t file_size =
      restarts_off +
      (tables.restart_entries == 0 ? 0 : 16 + tables.restart_entries * kRestartEntrySize + tables.restart_pool_bytes);
  std::uint32_t flags = tables.note.empty() ? 0 : kFlagNote;
  if (tables.restart_entries > 0) flags |= kFlagRestarts;

  std::vector<std::byte> meta(records_off);
  std::byte* h = meta.data();
  std::memcpy(h, kMagic, sizeof(kMagic));
  Store<std::uint32_t>(h + header::kVersionOff, tables.restart_entries == 0 ? kVersionWithoutRestarts : kVersion);
  Store<std::uint32_t>(h + header::kHeaderSizeOff, kHeaderSize);
  Store<std::uint64_t>(h + header::kFileSizeOff, file_size);
  Store<std::uint64_t>(h + header::kNumSamplesOff, tables.num_samples);
  Store<std::uint32_t>(h + header::kNumFieldsOff, static_cast<std::uint32_t>(num_fields));
  Store<std::uint32_t>(h + header::kNumShardsOff, static_cast<std::uint32_t>(num_shards));
  Store<std::uint32_t>(h + header::kRecordSizeOff, record_size);
  Store<std::uint32_t>(h + header::kFlagsOff, flags);
  Store<std::uint64_t>(h + header::kFieldsOff, fields_off);
  Store<std::uint64_t>(h + header::kShardsOff, shards_off);
  Store<std::uint64_t>(h + header::kStringsOff, strings_off);
  Store<std::uint64_t>(h + header::kStringsSizeOff, strings.size());
  Store<std::uint64_t>(h + header::kRecordsOff, records_off);
  Store<std::uint64_t>(h + header::kKeysOff, keys_off);
  Store<std::uint64_t>(h + header::kKeysSizeOff, tables.keys_bytes);
  Store<std::uint64_t>(h + header::kSkippedMembersOff, tables.skipped_members);
  for (std::size_t i = 0; i < num_fields; ++i) {
    std::byte* e = h + fields_off + i * kFieldEntrySize;
    const FieldEntry& field = tables.fields[i];
    Store<std::uint64_t>(e, field_strings[i].first);
    Store<std::uint32_t>(e + 8, field_strings[i].second);
    Store<std::uint8_t>(e + 12, field.kind);
    Store<std::uint64_t>(e + 16, field.samples);
    Store<std::uint64_t>(e + 24, field.bytes);
  }
  for (std::size_t i = 0; i < num_shards; ++i) {
    std::byte* e = h + shards_off + i * kShardEntrySize;
    const ShardEntry& shard = tables.shards[i];
    Store<std::uint64_t>(e, shard_strings[i].first);
    Store<std::uint32_t>(e + 8, shard_strings[i].second);
    Store<std::uint64_t>(e + 16, shard.size);
    Store<std::uint64_t>(e + 24, shard.checksum);
    Store<std::uint64_t>(e + 32, shard.first_sample);
    Store<std::uint64_t>(e + 40, shard.num_samples);
  }
  std::memcpy(h + strings_off, strings.data(), strings.size());

  // The header holds the data's checksum: hash the sections first, then write them.
  HashSink data_hash;
  STOKER_RETURN_IF_ERROR(WriteData(tables, sections, data_hash));
  Store<std::uint64_t>(h + header::kDataChecksumOff, data_hash.Digest());
  Store<std::uint64_t>(h + header::kMetaChecksumOff, MetaChecksum(meta));
  out.Expect(file_size);
  STOKER_RETURN_IF_ERROR(out.Write(meta));
  // What is written must be what was hashed: sections read from files (a
  // merge's parts) could change between the passes.
  HashSink written(&out);
  STOKER_RETURN_IF_ERROR(WriteData(tables, sections, written));
  if (written.Digest() != data_hash.Digest())
    return Status::Unavailable(
        "index writer: the samples' sections changed between hashing and writing them (a part rewritten while it "
        "was merged?); write the index again");
  return Status::Ok();
}

}  // namespace stoker::index_format
