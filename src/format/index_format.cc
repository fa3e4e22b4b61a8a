#include "format/index_format.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "core/hash.h"
#include "stoker/fields.h"

namespace stoker::index_format {
namespace {

// a + b, or false on overflow.
bool AddOk(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
bool MulOk(std::uint64_t a, std::uint64_t b, std::uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

static_assert(KindCode(FieldKind::kCustom) == kMaxKindCode);

std::uint64_t MetaChecksum(std::span<const std::byte> meta) {
  Xxh3Stream h;
  h.Update(meta.subspan(0, header::kMetaChecksumOff));
  const std::byte zeros[8] = {};
  h.Update(zeros);
  h.Update(meta.subspan(header::kMetaChecksumOff + 8));
  return h.Digest();
}

Result<IndexView> IndexView::Open(std::span<const std::byte> bytes, std::string where) {
  auto corrupt = [&](std::string_view what) {
    return Status::Corruption(fmt::format("{}: not a valid stoker index: {}", where, what));
  };
  if (bytes.size() < kHeaderSize)
    return corrupt(fmt::format("file is {} bytes, shorter than the 128-byte header", bytes.size()));
  if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return corrupt("bad magic (is this a stoker index file?)");
  const std::byte* h = bytes.data();
  const auto version = Load<std::uint32_t>(h + header::kVersionOff);
  if (version < kOldestVersion || version > kVersion)
    return Status::Unimplemented(
        fmt::format("{}: index format version {} is not supported (this stoker reads versions {} to {})", where,
                    version, kOldestVersion, kVersion));
  if (Load<std::uint32_t>(h + header::kHeaderSizeOff) != kHeaderSize) return corrupt("bad header size");
  const auto file_size = Load<std::uint64_t>(h + header::kFileSizeOff);
  if (file_size != bytes.size())
    return corrupt(
        fmt::format("header says {} bytes but the file has {} (truncated or appended to)", file_size, bytes.size()));

  IndexView view;
  view.bytes_ = bytes;
  view.where_ = where;  // a copy: `corrupt` above still names the index
  view.num_samples_ = Load<std::uint64_t>(h + header::kNumSamplesOff);
  const auto num_fields = Load<std::uint32_t>(h + header::kNumFieldsOff);
  const auto num_shards = Load<std::uint32_t>(h + header::kNumShardsOff);
  view.record_size_ = Load<std::uint32_t>(h + header::kRecordSizeOff);
  const auto fields_off = Load<std::uint64_t>(h + header::kFieldsOff);
  const auto shards_off = Load<std::uint64_t>(h + header::kShardsOff);
  const auto strings_off = Load<std::uint64_t>(h + header::kStringsOff);
  const auto strings_size = Load<std::uint64_t>(h + header::kStringsSizeOff);
  view.records_offset_ = Load<std::uint64_t>(h + header::kRecordsOff);
  view.keys_offset_ = Load<std::uint64_t>(h + header::kKeysOff);
  view.keys_size_ = Load<std::uint64_t>(h + header::kKeysSizeOff);
  view.data_checksum_ = Load<std::uint64_t>(h + header::kDataChecksumOff);
  view.skipped_members_ = Load<std::uint64_t>(h + header::kSkippedMembersOff);

  if (num_fields > kMaxFields)
    return corrupt(fmt::format("{} fields is more than the limit {}", num_fields, kMaxFields));
  if (num_shards > kMaxShards)
    return corrupt(fmt::format("{} shards is more than the limit {}", num_shards, kMaxShards));
  if (view.record_size_ != kRecordBaseSize + kFieldSlotSize * num_fields)
    return corrupt("record size does not match the field count");
  // Sections follow each other exactly: header, fields, shards, strings, records, keys.
  std::uint64_t end = 0, records_bytes = 0;
  if (fields_off != kHeaderSize) return corrupt("field table is not right after the header");
  const std::uint32_t field_entry_size = version >= kVersionWithFieldStats ? kFieldEntrySize : kFieldEntrySizeV1;
  if (shards_off != fields_off + std::uint64_t{field_entry_size} * num_fields) return corrupt("shard table misplaced");
  if (strings_off != shards_off + std::uint64_t{kShardEntrySize} * num_shards) return corrupt("string table misplaced");
  if (!AddOk(strings_off, strings_size, &end) || end > bytes.size()) return corrupt("string table runs past the end");
  if (view.records_offset_ < end || view.records_offset_ - end >= 8 || view.records_offset_ % 8 != 0)
    return corrupt("records misplaced");
  if (!MulOk(view.num_samples_, view.record_size_, &records_bytes) ||
      !AddOk(view.records_offset_, records_bytes, &end) || view.keys_offset_ != end)
    return corrupt("sample count does not match the size of the record section");
  const auto flags = Load<std::uint32_t>(h + header::kFlagsOff);
  const std::uint32_t known_flags =
      version < 3 ? 0 : (version < kVersionWithRestarts ? kFlagNote : kFlagNote | kFlagRestarts);
  if ((flags & ~known_flags) != 0) return corrupt(fmt::format("unknown header flags {:#x}", flags));
  if (!AddOk(view.keys_offset_, view.keys_size_, &end)) return corrupt("key section runs past the end");
  if (flags & kFlagNote) {
    // u64 size, then the note's bytes, ending the file.
    if (end > bytes.size() || bytes.size() - end < 8) return corrupt("note section runs past the end");
    const auto note_size = Load<std::uint64_t>(bytes.data() + end);
    if (note_size > kMaxNoteBytes || note_size > bytes.size() - end - 8)
      return corrupt("note section runs past the end");
    view.note_ = {reinterpret_cast<const char*>(bytes.data() + end + 8), note_size};
    if (view.note_.find('\0') != std::string_view::npos) return corrupt("note contains a NUL byte");
    end += 8 + note_size;
  }
  if (flags & kFlagRestarts) {
    // u64 entries E, u64 pool size T, E entries of 24 bytes, then the pool
    // (T u32 offsets in version 5, T bytes of varints in 6), ending the file.
    if (end > bytes.size() || bytes.size() - end < 16) return corrupt("restart section runs past the end");
    view.restart_entries_ = Load<std::uint64_t>(bytes.data() + end);
    view.restart_pool_ = Load<std::uint64_t>(bytes.data() + end + 8);
    view.restart_varints_ = version >= kVersionWithVarintRestarts;
    view.region_records_ = version >= kVersionWithRegionRecords;
    std::uint64_t entry_bytes = 0, pool_bytes = 0, section = 0;
    if (!MulOk(view.restart_entries_, kRestartEntrySize, &entry_bytes) ||
        !MulOk(view.restart_pool_, view.restart_varints_ ? 1 : 4, &pool_bytes) ||
        !AddOk(entry_bytes, pool_bytes, &section) || section != bytes.size() - end - 16)
      return corrupt("restart section does not end the file");
    view.restart_section_ = bytes.data() + end + 16;
    end = bytes.size();
  }
  if (end != bytes.size())
    return corrupt(flags & kFlagNote ? "note section does not end the file" : "key section does not end the file");
  if (MetaChecksum(bytes.subspan(0, view.records_offset_)) != Load<std::uint64_t>(h + header::kMetaChecksumOff))
    return corrupt("header checksum mismatch");

  // A string from the table, or nullopt when it lies outside (messages are
  // built only on failure: this loop runs once per shard).
  auto string_at = [&](const std::byte* entry) -> std::optional<std::string> {
    const auto off = Load<std::uint64_t>(entry);
    const auto len = Load<std::uint32_t>(entry + 8);
    std::uint64_t e = 0;
    if (!AddOk(off, len, &e) || e > strings_size) return std::nullopt;
    return std::string(reinterpret_cast<const char*>(bytes.data() + strings_off + off), len);
  };
  view.field_names_.reserve(num_fields);
  view.fields_.reserve(num_fields);
  for (std::uint32_t i = 0; i < num_fields; ++i) {
    const std::byte* entry = bytes.data() + fields_off + std::uint64_t{i} * field_entry_size;
    auto name = string_at(entry);
    if (!name) return corrupt(fmt::format("field {} name lies outside the string table", i));
    if (name->empty()) return corrupt(fmt::format("field {} has an empty name", i));
    if (name->find('\0') != std::string::npos) return corrupt(fmt::format("field {} name contains a NUL byte", i));
    if (i > 0 && !(view.field_names_.back() < *name)) return corrupt("field names are not sorted and unique");
    FieldEntry field;
    field.name = *name;
    if (version >= kVersionWithFieldStats) {
      field.has_stats = true;
      field.kind = Load<std::uint8_t>(entry + 12);
      field.samples = Load<std::uint64_t>(entry + 16);
      field.bytes = Load<std::uint64_t>(entry + 24);
      if (field.kind > kMaxKindCode)
        return corrupt(fmt::format("field '{}' has an unknown kind {}", *name, field.kind));
      if (Load<std::uint8_t>(entry + 13) != 0 || Load<std::uint16_t>(entry + 14) != 0)
        return corrupt(fmt::format("field '{}' entry has reserved bytes set", *name));
      if (field.samples > view.num_samples_)
        return corrupt(fmt::format("field '{}' is counted in {} samples, more than the index's {}", *name,
                                   field.samples, view.num_samples_));
    }
    view.fields_.push_back(std::move(field));
    view.field_names_.push_back(std::move(*name));
  }
  std::uint64_t next_sample = 0;
  view.shards_.reserve(num_shards);
  for (std::uint32_t i = 0; i < num_shards; ++i) {
    const std::byte* e = bytes.data() + shards_off + std::uint64_t{i} * kShardEntrySize;
    ShardEntry shard;
    auto path = string_at(e);
    if (!path) return corrupt(fmt::format("shard {} path lies outside the string table", i));
    if (path->empty()) return corrupt(fmt::format("shard {} has an empty path", i));
    if (path->find('\0') != std::string::npos) return corrupt(fmt::format("shard {} path contains a NUL byte", i));
    shard.path = std::move(*path);
    shard.size = Load<std::uint64_t>(e + 16);
    shard.checksum = Load<std::uint64_t>(e + 24);
    shard.first_sample = Load<std::uint64_t>(e + 32);
    shard.num_samples = Load<std::uint64_t>(e + 40);
    if (shard.first_sample != next_sample || !AddOk(next_sample, shard.num_samples, &next_sample))
      return corrupt(fmt::format("shard {} sample range is not contiguous with the previous shard", i));
    view.shards_.push_back(std::move(shard));
  }
  if (next_sample != view.num_samples_) return corrupt("shard sample counts do not add up to the sample count");
  return view;
}

Result<IndexView::Record> IndexView::record(std::uint64_t i) const {
  if (i >= num_samples_)
    return Status::InvalidArgument(
        fmt::format("{}: sample {} is out of range (the index has {} samples)", where_, i, num_samples_));
  const std::byte* r = bytes_.data() + records_offset_ + i * record_size_;
  Record rec;
  rec.shard = Load<std::uint32_t>(r);
  const auto key_len = Load<std::uint32_t>(r + 4);
  const auto key_off = Load<std::uint64_t>(r + 8);
  rec.label = Load<std::int64_t>(r + 16);
  rec.checksum = Load<std::uint64_t>(r + 24);
  rec.fields = r + kRecordBaseSize;
  auto corrupt = [&](std::string_view what) {
    return Status::Corruption(fmt::format("{}: record of sample {} is corrupt: {}", where_, i, what));
  };
  if (rec.shard >= shards_.size()) return corrupt("shard id out of range");
  const ShardEntry& shard = shards_[rec.shard];
  if (i < shard.first_sample || i - shard.first_sample >= shard.num_samples)
    return corrupt("sample does not belong to the shard it names");
  std::uint64_t end = 0;
  if (!AddOk(key_off, key_len, &end) || end > keys_size_) return corrupt("key lies outside the key section");
  rec.key = {reinterpret_cast<const char*>(bytes_.data() + keys_offset_ + key_off), key_len};
  if (rec.key.empty()) return corrupt("empty key");
  if (rec.key.find('\0') != std::string_view::npos) return corrupt("key contains a NUL byte");
  for (std::size_t f = 0; f < field_names_.size(); ++f) {
    FieldRange range = rec.field(f);
    if (!range.present()) continue;
    if (!AddOk(range.offset, range.size, &end) || end > shard.size)
      return corrupt(fmt::format("field '{}' lies outside shard '{}'", field_names_[f], shard.path));
  }
  return rec;
}

}  // namespace stoker::index_format
