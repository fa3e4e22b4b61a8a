// stoker merge: one index over the shards of several datasets, made from
// their indexes (see stoker/merge.h).
#include "stoker/merge.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "core/hash.h"
#include "format/index_format.h"
#include "format/index_note.h"
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

// Refuses a sample key found in two parts (keys name samples everywhere:
// `ls`, errors, the doctor). Within one part, keys are as that part's index
// was accepted.
Status CheckKeysAcrossParts(const std::vector<Part>& parts) {
  struct KeyRef {
    std::uint64_t hash;
    std::uint32_t part;
    std::uint64_t sample;
  };
  std::vector<KeyRef> refs;
  std::uint64_t total = 0;
  for (const auto& part : parts) total += part.view->num_samples();
  refs.reserve(total);
  for (std::uint32_t p = 0; p < parts.size(); ++p) {
    for (std::uint64_t i = 0; i < parts[p].view->num_samples(); ++i) {
      STOKER_ASSIGN_OR_RETURN(auto record, parts[p].view->record(i));
      const std::span<const std::byte> key{reinterpret_cast<const std::byte*>(record.key.data()), record.key.size()};
      refs.push_back({Xxh3(key), p, i});
    }
  }
  std::sort(refs.begin(), refs.end(),
            [](const KeyRef& a, const KeyRef& b) { return std::tie(a.hash, a.part) < std::tie(b.hash, b.part); });
  // Every key in two parts is counted; the first in the merged order is named.
  std::uint64_t repeated = 0;
  std::optional<std::pair<KeyRef, KeyRef>> first;  // (earlier part's, later part's)
  for (std::size_t i = 1; i < refs.size(); ++i) {
    if (refs[i].hash != refs[i - 1].hash || refs[i].part == refs[i - 1].part) continue;
    // Equal hashes from two parts: compare the keys (and any others of this hash).
    for (std::size_t j = i; j-- > 0 && refs[j].hash == refs[i].hash;) {
      if (refs[j].part == refs[i].part) continue;
      STOKER_ASSIGN_OR_RETURN(auto a, parts[refs[j].part].view->record(refs[j].sample));
      STOKER_ASSIGN_OR_RETURN(auto b, parts[refs[i].part].view->record(refs[i].sample));
      if (a.key != b.key) continue;
      ++repeated;
      if (!first || std::tie(refs[i].part, refs[i].sample) < std::tie(first->second.part, first->second.sample))
        first = {refs[j], refs[i]};
      break;
    }
  }
  if (first) {
    STOKER_ASSIGN_OR_RETURN(auto record, parts[first->second.part].view->record(first->second.sample));
    return Status::InvalidArgument(fmt::format(
        "sample key '{}' is in part '{}' and in part '{}'{}: keys name samples, so each must be in one part; give "
        "each writer its own keys (e.g. a prefix per worker)",
        Printable(record.key), Printable(parts[first->first.part].where), Printable(parts[first->second.part].where),
        repeated > 1 ? fmt::format(" (and {} more keys are in two parts)", repeated - 1) : ""));
  }
  return Status::Ok();
}

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

  // Shards: each named once, by its path below the output folder.
  std::unordered_map<std::string, std::size_t> shard_owner;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    for (const auto& shard : parts[p].view->shards()) {
      const fs_std::path full = (parts[p].folder / shard.path).lexically_normal();
      const auto below = Inside(full, out_dir);
      if (!below)
        return Status::InvalidArgument(fmt::format(
            "part '{}' names shard '{}', which is outside the output folder '{}' (move it into the part's folder)",
            Printable(parts[p].where), Printable(shard.path), Printable(output)));
      const auto [it, added] = shard_owner.emplace(below->string(), p);
      if (!added)
        return Status::InvalidArgument(fmt::format("shard '{}' is in part '{}' and in part '{}'",
                                                   Printable(full.string()), Printable(parts[it->second].where),
                                                   Printable(parts[p].where)));
    }
  }
  STOKER_RETURN_IF_ERROR(CheckKeysAcrossParts(parts));
  std::vector<std::string_view> notes;
  std::vector<std::string> wheres;
  for (const auto& part : parts) {
    notes.push_back(part.view->note());
    wheres.push_back(part.where);
  }
  STOKER_ASSIGN_OR_RETURN(std::string note, index_format::MergedNote(notes, wheres));
  summary.class_names = index_format::ClassNamesInNote(note);

  index_format::IndexBuilder builder;
  std::uint64_t skipped = 0;
  std::vector<index_format::IndexBuilder::Field> fields;
  std::vector<std::vector<std::uint32_t>> tables;
  std::vector<RegionRecord> regions;
  for (std::size_t p = 0; p < parts.size(); ++p) {
    const index_format::IndexView& view = *parts[p].view;
    skipped += view.skipped_members();
    std::uint64_t entry = 0;  // the next restart-table entry, in (sample, field) order
    std::uint64_t entry_sample = 0;
    std::uint32_t entry_field = 0;
    std::vector<std::uint32_t> entry_table;
    RegionRecord entry_region;
    bool entry_ok = false;
    const auto next_entry = [&] {
      entry_ok = entry < view.num_restart_tables() &&
                 view.restart_table_at(entry, &entry_sample, &entry_field, entry_table, &entry_region);
      if (entry < view.num_restart_tables() && !entry_ok)
        return Status::Corruption(
            fmt::format("{}: restart-table entry {} is damaged (stoker verify names more)", view.where(), entry));
      return Status::Ok();
    };
    STOKER_RETURN_IF_ERROR(next_entry());
    for (const auto& shard : view.shards()) {
      const fs_std::path full = (parts[p].folder / shard.path).lexically_normal();
      const std::uint32_t id = builder.AddShard(Inside(full, out_dir)->string());
      builder.SetShardContents(id, shard.size, shard.checksum);
      summary.shard_bytes += shard.size;
      for (std::uint64_t i = shard.first_sample; i < shard.first_sample + shard.num_samples; ++i) {
        STOKER_ASSIGN_OR_RETURN(auto record, view.record(i));
        fields.clear();
        tables.clear();
        regions.clear();
        for (std::uint32_t f = 0; f < view.fields().size(); ++f) {
          const auto range = record.field(f);
          if (!range.present()) continue;
          index_format::IndexBuilder::Field field{view.field_names()[f], range.offset, range.size,
                                                  view.fields()[f].kind};
          if (entry_ok && entry_sample == i && entry_field == f) {
            if (entry_region.rows() == 0)  // version 5-6: no region record, no geometry; the codec finds them
              return Status::FailedPrecondition(fmt::format(
                  "{}: sample '{}' is a seekable JPEG indexed before index version 7 (no region record); re-index "
                  "the part's shards with `stoker index --force` first",
                  view.where(), Printable(record.key)));
            tables.push_back(std::move(entry_table));
            regions.push_back(entry_region);
            field.geometry = entry_region.geometry;
            ++entry;
            STOKER_RETURN_IF_ERROR(next_entry());
          }
          fields.push_back(field);
        }
        // The tables and regions now stay put: point their fields at them (in the same order).
        std::size_t t = 0;
        for (auto& field : fields) {
          if (field.geometry == JpegGeometry{}) continue;
          field.restarts = tables[t];
          field.region = &regions[t];
          ++t;
        }
        summary.seekable_payloads += tables.size();
        STOKER_RETURN_IF_ERROR(
            builder.AddSample(id, record.key, record.label, record.checksum, fields).WithContext(view.where()));
      }
    }
    if (entry != view.num_restart_tables())
      return Status::Corruption(
          fmt::format("{}: restart-table entry {} names no sample's field (stoker verify)", view.where(), entry));
    summary.samples += view.num_samples();
    summary.shards += view.shards().size();
    if (options.on_progress) options.on_progress(p + 1, parts.size());
  }
  summary.parts = parts.size();
  builder.SetSkippedMembers(skipped);
  builder.SetNote(std::move(note));
  STOKER_ASSIGN_OR_RETURN(auto index_bytes, builder.Finish());
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(output));
  STOKER_RETURN_IF_ERROR(WriteWholeFileAtomically(fs, summary.index_path, index_bytes));
  return summary;
}

}  // namespace stoker
