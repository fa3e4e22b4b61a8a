// IndexBuilder: an index's tables gathered sample by sample, then written
// through WriteIndex (format/index_writer.h).
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "format/index_format.h"
#include "format/index_writer.h"

namespace stoker::index_format {

IndexBuilder::IndexBuilder() : restart_store_(std::make_unique<MemoryByteStore>()) {}
IndexBuilder::~IndexBuilder() = default;
IndexBuilder::IndexBuilder(IndexBuilder&&) noexcept = default;
IndexBuilder& IndexBuilder::operator=(IndexBuilder&&) noexcept = default;

void IndexBuilder::SetRestartStore(std::unique_ptr<ByteStore> store) {
  restart_store_ = std::move(store);
}

std::uint32_t IndexBuilder::AddShard(std::string path) {
  ShardEntry shard;
  shard.path = std::move(path);
  shard.first_sample = samples_.size();
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
  Sample s{shard,         static_cast<std::uint32_t>(key.size()),   keys_.size(), label, checksum,
           slots_.size(), static_cast<std::uint32_t>(fields.size())};
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
    slots_.push_back({id, fields[i].offset, fields[i].size});
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
      restarts_.push_back({samples_.size(), id, static_cast<std::uint32_t>(fields[i].restarts.size()),
                           restart_scratch_.size() - before});
    }
    STOKER_RETURN_IF_ERROR(restart_store_->Append(restart_scratch_));
  }
  keys_.append(key);
  samples_.push_back(s);
  shards_.back().num_samples++;
  return Status::Ok();
}

// The builder's samples as the index's sections, fields in name order.
class IndexBuilder::Sections final : public IndexSections {
 public:
  Sections(const IndexBuilder& builder, std::span<const std::uint32_t> rank) : b_(builder), rank_(rank) {}

  Status WriteRecords(ByteSink& out) override {
    std::vector<std::byte> record(RecordSize(rank_.size()));
    for (const Sample& s : b_.samples_) {
      EncodeRecord(record.data(), s.shard, s.key_len, s.key_offset, s.label, s.checksum, rank_.size());
      for (std::uint32_t k = 0; k < s.num_slots; ++k) {
        const Slot& slot = b_.slots_[s.first_slot + k];
        EncodeFieldSlot(record.data(), rank_[slot.field_id], slot.offset, slot.size);
      }
      STOKER_RETURN_IF_ERROR(out.Write(record));
    }
    return Status::Ok();
  }
  Status WriteKeys(ByteSink& out) override { return out.Write(std::as_bytes(std::span(b_.keys_))); }
  Status WriteRestartEntries(ByteSink& out) override {
    std::uint64_t next = 0;
    std::byte entry[kRestartEntrySize];
    for (const Restarts& r : b_.restarts_) {
      EncodeRestartEntry(entry, r.sample, rank_[r.field_id], r.entries, next);
      STOKER_RETURN_IF_ERROR(out.Write(entry));
      next += r.bytes;
    }
    return Status::Ok();
  }
  Status WriteRestartPool(ByteSink& out) override { return b_.restart_store_->WriteTo(out); }

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
  tables.num_samples = samples_.size();
  tables.keys_bytes = keys_.size();
  tables.skipped_members = skipped_members_;
  tables.note = note_;
  tables.restart_entries = restarts_.size();
  tables.restart_pool_bytes = restart_store_->size();
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
