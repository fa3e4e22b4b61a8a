// IndexBuilder: an index's tables gathered sample by sample, then written
// through WriteIndex (format/index_writer.h).
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <numeric>

#include <fmt/format.h>

#include "format/index_format.h"
#include "format/index_writer.h"

namespace stoker::index_format {

namespace {

// A sample as the builder keeps it until the index is written, in native
// byte order (it never leaves the process): a header, then its fields'
// slots, then its restart entries.
struct RawHeader {
  std::uint32_t shard, key_len;
  std::int64_t label;
  std::uint64_t checksum;
  std::uint32_t num_slots, num_restarts;
};
struct RawSlot {
  std::uint32_t field_id, unused;
  std::uint64_t offset, size;
};
struct RawRestart {
  std::uint32_t field_id, entries;
  std::uint64_t bytes;  // its table's, in the restart tables' store
};

template <typename T>
void AppendRaw(std::vector<std::byte>& out, const T& value) {
  const std::size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &value, sizeof(T));
}

template <typename T>
T ReadRaw(const std::byte* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// Takes a store of raw samples in pieces of any size (ByteStore::WriteTo)
// and calls `each(sample, header, slots, restarts)` for each whole one.
template <typename Each>
class RawSampleReader final : public ByteSink {
 public:
  explicit RawSampleReader(Each each) : each_(std::move(each)) {}
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override {
    pending_.insert(pending_.end(), bytes.begin(), bytes.end());
    std::size_t at = 0;
    while (pending_.size() - at >= sizeof(RawHeader)) {
      const auto header = ReadRaw<RawHeader>(pending_.data() + at);
      const std::size_t size = sizeof(RawHeader) + std::size_t{header.num_slots} * sizeof(RawSlot) +
                               std::size_t{header.num_restarts} * sizeof(RawRestart);
      if (pending_.size() - at < size) break;
      const std::byte* slots = pending_.data() + at + sizeof(RawHeader);
      const std::byte* restarts = slots + std::size_t{header.num_slots} * sizeof(RawSlot);
      STOKER_RETURN_IF_ERROR(each_(sample_++, header, slots, restarts));
      at += size;
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(at));
    return Status::Ok();
  }
  // After the store's last piece: Internal when a sample was cut short.
  [[nodiscard]] Status Finish(std::uint64_t expected_samples) const {
    if (!pending_.empty() || sample_ != expected_samples)
      return Status::Internal(fmt::format("index builder: {} samples read back of {}, {} bytes left over", sample_,
                                          expected_samples, pending_.size()));
    return Status::Ok();
  }

 private:
  Each each_;
  std::vector<std::byte> pending_;
  std::uint64_t sample_ = 0;
};

// Reads `store`'s raw samples through `each`.
template <typename Each>
Status ForEachRawSample(const ByteStore& store, std::uint64_t samples, Each each) {
  RawSampleReader<Each> reader(std::move(each));
  STOKER_RETURN_IF_ERROR(store.WriteTo(reader));
  return reader.Finish(samples);
}

}  // namespace

IndexBuilder::IndexBuilder() {
  SetStores({});
}
IndexBuilder::~IndexBuilder() = default;
IndexBuilder::IndexBuilder(IndexBuilder&&) noexcept = default;
IndexBuilder& IndexBuilder::operator=(IndexBuilder&&) noexcept = default;

void IndexBuilder::SetStores(Stores stores) {
  for (std::unique_ptr<ByteStore>* store : {&stores.records, &stores.keys, &stores.restart_tables})
    if (*store == nullptr) *store = std::make_unique<MemoryByteStore>();
  stores_ = std::move(stores);
}

std::uint32_t IndexBuilder::AddShard(std::string path) {
  ShardEntry shard;
  shard.path = std::move(path);
  shard.first_sample = num_samples_;
  shards_.push_back(std::move(shard));
  return static_cast<std::uint32_t>(shards_.size() - 1);
}

void IndexBuilder::SetShardContents(std::uint32_t shard, std::uint64_t size, std::uint64_t checksum) {
  shards_.at(shard).size = size;
  shards_.at(shard).checksum = checksum;
}

Status IndexBuilder::AddSample(std::uint32_t shard, std::string_view key, std::int64_t label, std::uint64_t checksum,
                               std::span<const Field> fields) {
  if (shard >= shards_.size() || shard + 1 != shards_.size())
    return Status::Internal(fmt::format("index builder: sample '{}' added to shard {} out of order", key, shard));
  if (key.size() > UINT32_MAX)
    return Status::InvalidArgument(fmt::format("sample key of {} bytes is too long", key.size()));
  record_scratch_.clear();
  AppendRaw(record_scratch_, RawHeader{shard, static_cast<std::uint32_t>(key.size()), label, checksum,
                                       static_cast<std::uint32_t>(fields.size()), 0});
  for (std::size_t i = 0; i < fields.size(); ++i) {
    for (std::size_t j = 0; j < i; ++j) {
      if (fields[i].name == fields[j].name)
        return Status::InvalidArgument(fmt::format("sample '{}' has field '{}' twice", key, fields[i].name));
    }
    const std::size_t restarts = fields[i].restarts.size();
    if (restarts == 1 || restarts > UINT32_MAX)
      return Status::InvalidArgument(
          fmt::format("sample '{}' field '{}': a restart table of {} offsets", key, fields[i].name, restarts));
    if (!std::is_sorted(fields[i].restarts.begin(), fields[i].restarts.end()))
      return Status::InvalidArgument(
          fmt::format("sample '{}' field '{}': a restart table whose offsets decrease", key, fields[i].name));
    if (restarts > 0) {
      const std::uint32_t rows = RegionRows(fields[i].geometry);
      const RegionRecord* region = fields[i].region;
      const bool region_fits = region != nullptr ? region->rows() == rows && region->geometry == fields[i].geometry
                                                 : fields[i].payload.size() == fields[i].size;
      if (rows == 0 || (restarts - 1) % rows != 0 || !region_fits || fields[i].restarts.back() > fields[i].size)
        return Status::InvalidArgument(fmt::format(
            "sample '{}' field '{}': a restart table of {} offsets that does not fit its {}x{} image (MCU rows of {} "
            "px) and {} bytes",
            key, fields[i].name, restarts, fields[i].geometry.width, fields[i].geometry.height,
            fields[i].geometry.mcu_height, fields[i].size));
    }
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    auto it = std::find(field_names_.begin(), field_names_.end(), fields[i].name);
    std::uint32_t id = static_cast<std::uint32_t>(it - field_names_.begin());
    if (it == field_names_.end()) {
      if (field_names_.size() >= kMaxFields)
        return Status::InvalidArgument(fmt::format("more than {} distinct field names", kMaxFields));
      field_names_.emplace_back(fields[i].name);
      field_totals_.emplace_back();
    }
    FieldTotals& totals = field_totals_[id];
    totals.kind = totals.kind_set ? WidenKind(totals.kind, fields[i].kind) : fields[i].kind;
    totals.kind_set = true;
    totals.samples++;
    totals.bytes += fields[i].size;
    AppendRaw(record_scratch_, RawSlot{id, 0, fields[i].offset, fields[i].size});
  }
  // The sample's restart tables in field-name order, the index's, so that the store holds them as written.
  std::vector<std::size_t> seekable;
  for (std::size_t i = 0; i < fields.size(); ++i)
    if (!fields[i].restarts.empty()) seekable.push_back(i);
  if (!seekable.empty()) {
    std::sort(seekable.begin(), seekable.end(),
              [&](std::size_t a, std::size_t b) { return fields[a].name < fields[b].name; });
    restart_scratch_.clear();
    for (const std::size_t i : seekable) {
      const std::size_t before = restart_scratch_.size();
      AppendRestartTable(fields[i].restarts, MakeRegionRecord(fields, i), restart_scratch_);
      const auto id = static_cast<std::uint32_t>(std::find(field_names_.begin(), field_names_.end(), fields[i].name) -
                                                 field_names_.begin());
      AppendRaw(record_scratch_, RawRestart{id, static_cast<std::uint32_t>(fields[i].restarts.size()),
                                            restart_scratch_.size() - before});
    }
    const auto restarts = static_cast<std::uint32_t>(seekable.size());
    std::memcpy(record_scratch_.data() + offsetof(RawHeader, num_restarts), &restarts, sizeof(restarts));
    STOKER_RETURN_IF_ERROR(stores_.restart_tables->Append(restart_scratch_));
    restart_entries_ += restarts;
  }
  if (num_samples_ % kKeyStride == 0) key_offsets_.push_back(stores_.keys->size());
  STOKER_RETURN_IF_ERROR(stores_.keys->Append(std::as_bytes(std::span(key))));
  STOKER_RETURN_IF_ERROR(stores_.records->Append(record_scratch_));
  if (key.size() >= kLongKey) long_key_lengths_.emplace_back(num_samples_, key.size());
  key_lengths_.push_back(static_cast<std::uint16_t>(std::min<std::size_t>(key.size(), kLongKey)));
  ++num_samples_;
  shards_.back().num_samples++;
  return Status::Ok();
}

std::uint64_t IndexBuilder::KeyLength(std::uint64_t i) const {
  if (key_lengths_[i] != kLongKey) return key_lengths_[i];
  const auto it = std::lower_bound(long_key_lengths_.begin(), long_key_lengths_.end(),
                                   std::pair<std::uint64_t, std::uint64_t>{i, 0});
  return it->second;
}

Result<std::string> IndexBuilder::Key(std::uint64_t i) const {
  if (i >= num_samples_) return Status::Internal(fmt::format("index builder: key of sample {} of {}", i, num_samples_));
  std::uint64_t offset = key_offsets_[i / kKeyStride];
  for (std::uint64_t j = i - i % kKeyStride; j < i; ++j) offset += KeyLength(j);
  std::string key(KeyLength(i), '\0');
  STOKER_RETURN_IF_ERROR(stores_.keys->ReadAt(offset, std::as_writable_bytes(std::span(key))));
  return key;
}

// The builder's samples as the index's sections, fields in name order.
class IndexBuilder::Sections final : public IndexSections {
 public:
  Sections(const IndexBuilder& builder, std::span<const std::uint32_t> rank) : b_(builder), rank_(rank) {}

  Status WriteRecords(ByteSink& out) override {
    std::vector<std::byte> record(RecordSize(rank_.size()));
    std::uint64_t key_offset = 0;
    return ForEachRawSample(*b_.stores_.records, b_.num_samples_,
                            [&](std::uint64_t, const RawHeader& h, const std::byte* slots, const std::byte*) -> Status {
                              EncodeRecord(record.data(), h.shard, h.key_len, key_offset, h.label, h.checksum,
                                           rank_.size());
                              key_offset += h.key_len;
                              for (std::uint32_t k = 0; k < h.num_slots; ++k) {
                                const auto slot = ReadRaw<RawSlot>(slots + std::size_t{k} * sizeof(RawSlot));
                                EncodeFieldSlot(record.data(), rank_[slot.field_id], slot.offset, slot.size);
                              }
                              return out.Write(record);
                            });
  }
  Status WriteKeys(ByteSink& out) override { return b_.stores_.keys->WriteTo(out); }
  Status WriteRestartEntries(ByteSink& out) override {
    std::uint64_t next = 0;
    std::byte entry[kRestartEntrySize];
    return ForEachRawSample(
        *b_.stores_.records, b_.num_samples_,
        [&](std::uint64_t sample, const RawHeader& h, const std::byte*, const std::byte* restarts) -> Status {
          for (std::uint32_t k = 0; k < h.num_restarts; ++k) {
            const auto r = ReadRaw<RawRestart>(restarts + std::size_t{k} * sizeof(RawRestart));
            EncodeRestartEntry(entry, sample, rank_[r.field_id], r.entries, next);
            STOKER_RETURN_IF_ERROR(out.Write(entry));
            next += r.bytes;
          }
          return Status::Ok();
        });
  }
  Status WriteRestartPool(ByteSink& out) override { return b_.stores_.restart_tables->WriteTo(out); }

 private:
  const IndexBuilder& b_;
  std::span<const std::uint32_t> rank_;
};

Status IndexBuilder::FinishTo(ByteSink& out) const {
  // Field ids sorted by name.
  std::vector<std::uint32_t> order(field_names_.size());
  std::iota(order.begin(), order.end(), 0u);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return field_names_[a] < field_names_[b]; });
  std::vector<std::uint32_t> rank(field_names_.size());
  for (std::uint32_t r = 0; r < order.size(); ++r) rank[order[r]] = r;
  IndexTables tables;
  for (const std::uint32_t id : order) {
    FieldEntry& field = tables.fields.emplace_back();
    field.name = field_names_[id];
    field.kind = field_totals_[id].kind;
    field.samples = field_totals_[id].samples;
    field.bytes = field_totals_[id].bytes;
  }
  tables.shards = shards_;
  tables.num_samples = num_samples_;
  tables.keys_bytes = stores_.keys->size();
  tables.skipped_members = skipped_members_;
  tables.note = note_;
  tables.restart_entries = restart_entries_;
  tables.restart_pool_bytes = stores_.restart_tables->size();
  Sections sections(*this, rank);
  return WriteIndex(tables, sections, out);
}

Result<std::vector<std::byte>> IndexBuilder::Finish() const {
  std::vector<std::byte> out;
  VectorSink sink(out);
  STOKER_RETURN_IF_ERROR(FinishTo(sink));
  return out;
}

}  // namespace stoker::index_format
