// stoker merge: one index over the shards of several datasets, made from
// their indexes (see stoker/merge.h).
#include "stoker/merge.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "core/hash.h"
#include "dataset/index_file.h"
#include "format/index_format.h"
#include "format/index_note.h"
#include "format/index_writer.h"
#include "stoker/dataset.h"
#include "stoker/text.h"

namespace stoker {
namespace {

namespace fs_std = std::filesystem;

struct Part {
  std::string where;       // as given, for messages
  std::string index_path;  // its index file
  fs_std::path folder;     // the index's folder, absolute and normal
  std::unique_ptr<MappedFile> mapped;
  std::optional<index_format::IndexView> view;
};

// `inner` relative to `outer` when it lies inside it (both absolute and
// normal): the path below, else nothing.
std::optional<fs_std::path> Inside(const fs_std::path& inner, const fs_std::path& outer) {
  auto o = outer.begin();
  auto i = inner.begin();
  for (; o != outer.end(); ++o, ++i)
    if (i == inner.end() || *i != *o) return std::nullopt;
  fs_std::path below;
  for (; i != inner.end(); ++i) below /= *i;
  return below;
}

// Absolute, without "." or "..", and without a trailing separator ("data/" is "data").
fs_std::path Normal(const std::string& path) {
  fs_std::path normal = fs_std::absolute(path).lexically_normal();
  if (!normal.has_filename() && normal != normal.root_path()) normal = normal.parent_path();
  return normal;
}

bool IsUrl(std::string_view path) {
  return path.find("://") != std::string_view::npos;
}

Result<Part> OpenPart(FileSystem& fs, const std::string& where) {
  Part part;
  part.where = where;
  if (IsUrl(where))
    return Status::InvalidArgument(fmt::format(
        "part '{}' is a URL: merge writes an index beside local parts; merge them where they were written, then "
        "upload the folder",
        Printable(where)));
  auto info = fs.Stat(where);
  if (!info.ok()) return info.status().WithContext(fmt::format("part '{}'", Printable(where)));
  part.index_path =
      info->type == FileType::kDirectory ? (fs_std::path(where) / std::string(kIndexFileName)).string() : where;
  part.folder = Normal(part.index_path).parent_path();
  auto mapped = fs.Map(part.index_path);
  if (!mapped.ok())
    return mapped.status().WithContext(fmt::format("part '{}' (a dataset folder or its index file)", Printable(where)));
  part.mapped = std::move(*mapped);
  STOKER_ASSIGN_OR_RETURN(auto view, index_format::IndexView::Open(part.mapped->data(), part.index_path));
  // The records are copied into an index with a checksum of its own: a damaged one must not pass as whole.
  if (Xxh3(view.data_section()) != view.data_checksum())
    return Status::Corruption(fmt::format(
        "{}: the index's records or keys do not match its data checksum (damaged); `stoker verify` names the samples",
        part.index_path));
  part.view.emplace(std::move(view));
  return part;
}

// What a merge needs of a part beyond its view, found in one scan of it.
struct PartScan {
  std::uint64_t first_sample = 0;                         // its first sample in the merged index
  std::uint32_t first_shard = 0;                          // its first shard there
  std::vector<std::uint32_t> merged_field;                // its fields' places in the merged field table
  std::vector<std::uint64_t> field_samples, field_bytes;  // per field of its own
  std::uint64_t keys_bytes = 0;
  std::vector<std::uint32_t> table_bytes;  // each restart table's size in the merged pool
  // Whether every table is stored as the merged index stores it (minimal
  // varints), so that its bytes are copied rather than re-encoded.
  bool tables_as_stored = true;
};

// A sample's key hash, by its place in the merged index.
struct KeyRef {
  std::uint64_t hash;
  std::uint64_t sample;
};

// Reads every record and restart table of `part` (checked as an index
// built from them would check them), noting what the merged tables need
// and each key's hash.
Status ScanPart(const Part& part, PartScan& scan, std::vector<KeyRef>& keys) {
  const index_format::IndexView& view = *part.view;
  scan.field_samples.assign(view.fields().size(), 0);
  scan.field_bytes.assign(view.fields().size(), 0);
  scan.table_bytes.reserve(view.num_restart_tables());
  std::uint64_t entry = 0;  // the next restart-table entry, in (sample, field) order
  std::uint64_t entry_sample = 0;
  std::uint32_t entry_field = 0;
  std::vector<std::uint32_t> table;
  RegionRecord region;
  std::span<const std::byte> stored;
  std::vector<std::byte> encoded;
  bool entry_ok = false;
  const auto next_entry = [&] {
    entry_ok = entry < view.num_restart_tables() &&
               view.restart_table_at(entry, &entry_sample, &entry_field, table, region, stored);
    if (entry < view.num_restart_tables() && !entry_ok)
      return Status::Corruption(
          fmt::format("{}: restart-table entry {} is damaged (stoker verify names more)", view.where(), entry));
    return Status::Ok();
  };
  STOKER_RETURN_IF_ERROR(next_entry());
  for (std::uint64_t i = 0; i < view.num_samples(); ++i) {
    STOKER_ASSIGN_OR_RETURN(auto record, view.record(i));
    keys.push_back({Xxh3(std::as_bytes(std::span(record.key))), scan.first_sample + i});
    scan.keys_bytes += record.key.size();
    for (std::uint32_t f = 0; f < view.fields().size(); ++f) {
      const auto range = record.field(f);
      if (!range.present()) continue;
      scan.field_samples[f]++;
      scan.field_bytes[f] += range.size;
      if (!entry_ok || entry_sample != i || entry_field != f) continue;
      if (region.rows() == 0 && view.has_region_records())  // version 7: the record did not read
        return Status::Corruption(
            fmt::format("{}: sample '{}': its seekable JPEG's region record is damaged (stoker verify names more)",
                        view.where(), Printable(record.key)));
      if (region.rows() == 0)  // version 5-6: no region record, no geometry; the codec finds them
        return Status::FailedPrecondition(fmt::format(
            "{}: sample '{}' is a seekable JPEG indexed before index version 7 (no region record); re-index the "
            "part's shards with `stoker index --force` first",
            view.where(), Printable(record.key)));
      if (table.back() > range.size)
        return Status::Corruption(fmt::format(
            "{}: sample '{}' field '{}': a restart table that runs past the field's {} bytes (stoker verify)",
            view.where(), Printable(record.key), view.field_names()[f], range.size));
      encoded.clear();
      index_format::AppendRestartTable(table, region, encoded);
      scan.table_bytes.push_back(static_cast<std::uint32_t>(encoded.size()));
      // The same size means the same bytes: each value has one minimal encoding.
      if (stored.size() != encoded.size()) scan.tables_as_stored = false;
      ++entry;
      STOKER_RETURN_IF_ERROR(next_entry());
    }
  }
  if (entry != view.num_restart_tables())
    return Status::Corruption(
        fmt::format("{}: restart-table entry {} names no sample's field (stoker verify)", view.where(), entry));
  return Status::Ok();
}

// Refuses a sample key found in two parts (keys name samples everywhere:
// `ls`, errors, the doctor). Within one part, keys are as that part's index
// was accepted. `keys`: every sample's, in merged order (sorted here).
Status CheckKeysAcrossParts(const std::vector<Part>& parts, const std::vector<PartScan>& scans,
                            std::vector<KeyRef>& keys) {
  const auto part_of = [&](std::uint64_t sample) {
    const auto after = std::upper_bound(scans.begin(), scans.end(), sample,
                                        [](std::uint64_t s, const PartScan& scan) { return s < scan.first_sample; });
    return static_cast<std::size_t>(after - scans.begin()) - 1;
  };
  const auto key_of = [&](std::uint64_t sample) -> Result<std::string_view> {
    const std::size_t p = part_of(sample);
    STOKER_ASSIGN_OR_RETURN(auto record, parts[p].view->record(sample - scans[p].first_sample));
    return record.key;
  };
  std::sort(keys.begin(), keys.end(),
            [](const KeyRef& a, const KeyRef& b) { return std::tie(a.hash, a.sample) < std::tie(b.hash, b.sample); });
  // Every key in two parts is counted; the first in the merged order is named.
  std::uint64_t repeated = 0;
  std::optional<std::pair<std::uint64_t, std::uint64_t>> first;  // (earlier part's sample, later part's)
  for (std::size_t i = 1; i < keys.size(); ++i) {
    if (keys[i].hash != keys[i - 1].hash) continue;
    const std::size_t part = part_of(keys[i].sample);
    if (part == part_of(keys[i - 1].sample)) continue;
    // Equal hashes from two parts: compare the keys (and any others of this hash).
    STOKER_ASSIGN_OR_RETURN(const std::string_view key, key_of(keys[i].sample));
    for (std::size_t j = i; j-- > 0 && keys[j].hash == keys[i].hash;) {
      if (part_of(keys[j].sample) == part) continue;
      STOKER_ASSIGN_OR_RETURN(const std::string_view other, key_of(keys[j].sample));
      if (other != key) continue;
      ++repeated;
      if (!first || keys[i].sample < first->second) first = {keys[j].sample, keys[i].sample};
      break;
    }
  }
  if (first) {
    STOKER_ASSIGN_OR_RETURN(const std::string_view key, key_of(first->second));
    return Status::InvalidArgument(fmt::format(
        "sample key '{}' is in part '{}' and in part '{}'{}: keys name samples, so each must be in one part; give "
        "each writer its own keys (e.g. a prefix per worker)",
        Printable(key), Printable(parts[part_of(first->first)].where), Printable(parts[part_of(first->second)].where),
        repeated > 1 ? fmt::format(" (and {} more keys are in two parts)", repeated - 1) : ""));
  }
  return Status::Ok();
}

// The merged index's per-sample sections, read from the parts as they are
// written: records with their shards and fields renumbered, keys, restart
// tables re-encoded.
// Passes bytes on, telling `progress` (bytes written, bytes expected) after
// every 16 MiB and at the end.
class ProgressSink final : public index_format::ByteSink {
 public:
  ProgressSink(index_format::ByteSink& out, const std::function<void(std::uint64_t, std::uint64_t)>& progress)
      : out_(out), progress_(progress) {}
  void Expect(std::uint64_t bytes) override {
    expected_ = bytes;
    out_.Expect(bytes);
  }
  [[nodiscard]] Status Write(std::span<const std::byte> bytes) override {
    STOKER_RETURN_IF_ERROR(out_.Write(bytes));
    written_ += bytes.size();
    if (written_ - told_ >= kEvery || written_ == expected_) {
      told_ = written_;
      progress_(written_, expected_);
    }
    return Status::Ok();
  }

 private:
  static constexpr std::uint64_t kEvery = std::uint64_t{16} << 20;
  index_format::ByteSink& out_;
  const std::function<void(std::uint64_t, std::uint64_t)>& progress_;
  std::uint64_t expected_ = 0, written_ = 0, told_ = 0;
};

class MergedSections final : public index_format::IndexSections {
 public:
  MergedSections(const std::vector<Part>& parts, const std::vector<PartScan>& scans, std::size_t num_fields)
      : parts_(parts), scans_(scans), num_fields_(num_fields) {}

  Status WriteRecords(index_format::ByteSink& out) override {
    std::vector<std::byte> merged(index_format::RecordSize(num_fields_));
    std::uint64_t key_offset = 0;
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      const index_format::IndexView& view = *parts_[p].view;
      const PartScan& scan = scans_[p];
      for (std::uint64_t i = 0; i < view.num_samples(); ++i) {
        STOKER_ASSIGN_OR_RETURN(auto record, view.record(i));
        index_format::EncodeRecord(merged.data(), scan.first_shard + record.shard,
                                   static_cast<std::uint32_t>(record.key.size()), key_offset, record.label,
                                   record.checksum, num_fields_);
        key_offset += record.key.size();
        for (std::uint32_t f = 0; f < view.fields().size(); ++f) {
          const auto range = record.field(f);
          if (range.present())
            index_format::EncodeFieldSlot(merged.data(), scan.merged_field[f], range.offset, range.size);
        }
        STOKER_RETURN_IF_ERROR(out.Write(merged));
      }
    }
    return Status::Ok();
  }
  Status WriteKeys(index_format::ByteSink& out) override {
    for (const Part& part : parts_) {
      for (std::uint64_t i = 0; i < part.view->num_samples(); ++i) {
        STOKER_ASSIGN_OR_RETURN(auto record, part.view->record(i));
        STOKER_RETURN_IF_ERROR(out.Write(std::as_bytes(std::span(record.key))));
      }
    }
    return Status::Ok();
  }
  Status WriteRestartEntries(index_format::ByteSink& out) override {
    std::uint64_t pool_offset = 0;
    std::byte entry[index_format::kRestartEntrySize];
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      const PartScan& scan = scans_[p];
      for (std::uint64_t e = 0; e < scan.table_bytes.size(); ++e) {
        std::uint64_t sample = 0;
        std::uint32_t field = 0, offsets = 0;
        parts_[p].view->restart_entry_owner(e, &sample, &field, &offsets);  // read whole by the scan
        index_format::EncodeRestartEntry(entry, scan.first_sample + sample, scan.merged_field[field], offsets,
                                         pool_offset);
        STOKER_RETURN_IF_ERROR(out.Write(entry));
        pool_offset += scan.table_bytes[e];
      }
    }
    return Status::Ok();
  }
  Status WriteRestartPool(index_format::ByteSink& out) override {
    std::vector<std::byte> encoded;
    RegionRecord region;
    for (std::size_t p = 0; p < parts_.size(); ++p) {
      const index_format::IndexView& view = *parts_[p].view;
      const PartScan& scan = scans_[p];
      for (std::uint64_t e = 0; e < scan.table_bytes.size(); ++e) {
        std::span<const std::byte> table_bytes;
        if (scan.tables_as_stored) {
          table_bytes = view.restart_table_bytes(e, scan.table_bytes[e]);
        } else {
          std::uint64_t sample = 0;
          std::uint32_t field = 0;
          encoded.clear();
          if (view.restart_table_at(e, &sample, &field, table_, &region))
            index_format::AppendRestartTable(table_, region, encoded);
          table_bytes = encoded;
        }
        if (table_bytes.size() != scan.table_bytes[e])
          return Status::Internal(fmt::format("{}: restart-table entry {} changed while merging", view.where(), e));
        STOKER_RETURN_IF_ERROR(out.Write(table_bytes));
      }
    }
    return Status::Ok();
  }

 private:
  const std::vector<Part>& parts_;
  const std::vector<PartScan>& scans_;
  std::size_t num_fields_;
  std::vector<std::uint32_t> table_;
};

}  // namespace

Result<MergeSummary> MergeDatasets(const std::vector<std::string>& part_paths, const std::string& output,
                                   const MergeOptions& options) {
  FileSystem& fs = *options.file_system;
  if (part_paths.empty()) return Status::InvalidArgument("no parts to merge");
  if (IsUrl(output))
    return Status::InvalidArgument(fmt::format("output '{}' is a URL: merge writes a local index", Printable(output)));
  MergeSummary summary;
  const fs_std::path out_dir = Normal(output);
  summary.index_path = (fs_std::path(output) / std::string(kIndexFileName)).string();

  std::vector<Part> parts;
  parts.reserve(part_paths.size());
  for (const auto& path : part_paths) {
    STOKER_ASSIGN_OR_RETURN(Part part, OpenPart(fs, path));
    if (part.folder == out_dir)
      return Status::InvalidArgument(fmt::format(
          "part '{}' is the output folder itself: its index would be replaced; merge into the folder that holds the "
          "parts",
          Printable(path)));
    if (!Inside(part.folder, out_dir))
      return Status::InvalidArgument(fmt::format(
          "part '{}' is not inside the output folder '{}': the merged index names shards by paths relative to its "
          "folder, so that the folder moves or is uploaded whole; write the parts into subfolders of it (e.g. "
          "{}/part-00000)",
          Printable(path), Printable(output), Printable(output)));
    for (const auto& earlier : parts)
      if (earlier.index_path == part.index_path || earlier.folder == part.folder)
        return Status::InvalidArgument(fmt::format("part '{}' is given twice", Printable(path)));
    parts.push_back(std::move(part));
  }
  if (fs.Stat(summary.index_path).ok() && !options.overwrite)
    return Status::AlreadyExists(
        fmt::format("'{}' exists; pass --force (overwrite) to replace it", Printable(summary.index_path)));

  // Shards: each named once, by its path below the output folder (in part and shard order).
  std::unordered_map<std::string, std::size_t> shard_owner;
  std::vector<std::string> shard_paths;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    for (const auto& shard : parts[p].view->shards()) {
      const fs_std::path full = (parts[p].folder / shard.path).lexically_normal();
      const auto below = Inside(full, out_dir);
      if (!below)
        return Status::InvalidArgument(fmt::format(
            "part '{}' names shard '{}', which is outside the output folder '{}' (move it into the part's folder)",
            Printable(parts[p].where), Printable(shard.path), Printable(output)));
      shard_paths.push_back(below->string());
      const auto [it, added] = shard_owner.emplace(shard_paths.back(), p);
      if (!added)
        return Status::InvalidArgument(fmt::format("shard '{}' is in part '{}' and in part '{}'",
                                                   Printable(full.string()), Printable(parts[it->second].where),
                                                   Printable(parts[p].where)));
    }
  }
  // One scan of every part checks it and finds what the merged tables need.
  std::vector<PartScan> scans(parts.size());
  std::vector<KeyRef> keys;
  std::uint64_t total_samples = 0;
  for (const auto& part : parts) total_samples += part.view->num_samples();
  keys.reserve(total_samples);
  for (std::size_t p = 0; p < parts.size(); ++p) {
    scans[p].first_sample = summary.samples;
    scans[p].first_shard = static_cast<std::uint32_t>(summary.shards);
    STOKER_RETURN_IF_ERROR(ScanPart(parts[p], scans[p], keys));
    summary.samples += parts[p].view->num_samples();
    summary.shards += parts[p].view->shards().size();
    summary.seekable_payloads += scans[p].table_bytes.size();
    if (options.on_progress) options.on_progress(p + 1, parts.size());
  }
  if (summary.shards > index_format::kMaxShards)
    return Status::InvalidArgument(fmt::format("the parts have {} shards, more than an index holds ({})",
                                               summary.shards, index_format::kMaxShards));
  STOKER_RETURN_IF_ERROR(CheckKeysAcrossParts(parts, scans, keys));
  std::vector<KeyRef>().swap(keys);
  std::vector<std::string_view> notes;
  std::vector<std::string> wheres;
  for (const auto& part : parts) {
    notes.push_back(part.view->note());
    wheres.push_back(part.where);
  }
  STOKER_ASSIGN_OR_RETURN(std::string note, index_format::MergedNote(notes, wheres));
  summary.class_names = index_format::ClassNamesInNote(note);

  // The merged tables: fields united by name (kinds widened in part order), shards in part order.
  index_format::IndexTables tables;
  std::map<std::string_view, index_format::FieldEntry> fields;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto& part_fields = parts[p].view->fields();
    for (std::size_t f = 0; f < part_fields.size(); ++f) {
      if (scans[p].field_samples[f] == 0) continue;
      auto [it, added] = fields.try_emplace(part_fields[f].name);
      index_format::FieldEntry& field = it->second;
      field.name = part_fields[f].name;
      field.kind = added ? part_fields[f].kind : index_format::WidenKind(field.kind, part_fields[f].kind);
      field.samples += scans[p].field_samples[f];
      field.bytes += scans[p].field_bytes[f];
    }
  }
  for (auto& [name, field] : fields) tables.fields.push_back(std::move(field));
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const auto& part_fields = parts[p].view->fields();
    scans[p].merged_field.resize(part_fields.size());
    for (std::size_t f = 0; f < part_fields.size(); ++f) {
      const auto it = std::lower_bound(
          tables.fields.begin(), tables.fields.end(), part_fields[f].name,
          [](const index_format::FieldEntry& field, const std::string& name) { return field.name < name; });
      scans[p].merged_field[f] = static_cast<std::uint32_t>(it - tables.fields.begin());
    }
    for (const auto& shard : parts[p].view->shards()) {
      index_format::ShardEntry& merged = tables.shards.emplace_back(shard);
      merged.path = std::move(shard_paths[tables.shards.size() - 1]);
      merged.first_sample += scans[p].first_sample;
      summary.shard_bytes += shard.size;
    }
    tables.keys_bytes += scans[p].keys_bytes;
    tables.skipped_members += parts[p].view->skipped_members();
    tables.restart_entries += scans[p].table_bytes.size();
    for (const std::uint32_t bytes : scans[p].table_bytes) tables.restart_pool_bytes += bytes;
  }
  tables.num_samples = summary.samples;
  tables.note = std::move(note);
  summary.parts = parts.size();
  MergedSections sections(parts, scans, tables.fields.size());
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(output));
  STOKER_RETURN_IF_ERROR(WriteIndexFile(fs, summary.index_path, [&](index_format::ByteSink& out) {
    if (!options.on_write_progress) return index_format::WriteIndex(tables, sections, out);
    ProgressSink told(out, options.on_write_progress);
    return index_format::WriteIndex(tables, sections, told);
  }));
  return summary;
}

}  // namespace stoker
