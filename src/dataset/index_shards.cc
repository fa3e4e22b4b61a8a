// stoker index: an index for shards written by anything else (GNU tar,
// webdataset's TarWriter, ...), holding exactly the samples the webdataset
// library would yield from them.
#include "dataset/index_shards.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "core/hash.h"
#include "dataset/index_file.h"
#include "format/index_format.h"
#include "format/webdataset.h"
#include "stoker/dataset.h"
#include "stoker/pack.h"
#include "stoker/text.h"

namespace stoker::index_internal {
namespace {

namespace fs_std = std::filesystem;

// Members left out are named one by one up to this many, then counted.
constexpr std::uint64_t kNamedSkips = 20;

}  // namespace

Result<std::vector<std::string>> TarFilesIn(FileSystem& fs, const std::string& folder) {
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(folder));
  std::vector<std::string> tars;
  for (const auto& entry : entries) {
    if (entry.name.size() > 4 && entry.name.ends_with(".tar") && entry.type == FileType::kRegular)
      tars.push_back((fs_std::path(folder) / entry.name).string());
  }
  std::sort(tars.begin(), tars.end());
  return tars;
}

Result<IndexSummary> IndexShardsWith(const std::vector<std::string>& shard_patterns, const IndexOptions& options,
                                     const RestartTableFinder& find_restarts,
                                     const pack_internal::PayloadCheck* check) {
  FileSystem& fs = *options.file_system;
  std::vector<std::string> paths;
  for (const auto& pattern : shard_patterns) {
    STOKER_ASSIGN_OR_RETURN(auto expanded, wds::ExpandBraces(pattern));
    for (auto& path : expanded) {
      auto info = fs.Stat(path);
      if (!info.ok() || info->type != FileType::kDirectory) {
        paths.push_back(std::move(path));
        continue;
      }
      STOKER_ASSIGN_OR_RETURN(auto tars, TarFilesIn(fs, path));
      if (tars.empty()) return Status::InvalidArgument(fmt::format("folder '{}' holds no .tar shards", path));
      paths.insert(paths.end(), tars.begin(), tars.end());
    }
  }
  if (paths.empty()) return Status::InvalidArgument("no shards given");
  {
    std::vector<std::string> sorted = paths;
    std::sort(sorted.begin(), sorted.end());
    auto dup = std::adjacent_find(sorted.begin(), sorted.end());
    if (dup != sorted.end()) return Status::InvalidArgument(fmt::format("shard '{}' is listed twice", *dup));
  }
  IndexSummary summary;
  summary.index_path = options.output.empty()
                           ? (fs_std::path(paths[0]).parent_path() / std::string(kIndexFileName)).string()
                           : options.output;
  if (fs.Stat(summary.index_path).ok() && !options.overwrite)
    return Status::AlreadyExists(fmt::format("'{}' exists; pass --force to replace it", summary.index_path));
  const fs_std::path index_dir = fs_std::absolute(fs_std::path(summary.index_path)).parent_path();

  index_format::IndexBuilder builder;
  builder.SetStores(BuilderStoresFor(fs, index_dir.string()));
  std::vector<index_format::IndexBuilder::Field> fields;
  std::vector<SeekableTable> restarts;  // the fields' tables (their spans point here)
  for (std::size_t i = 0; i < paths.size(); ++i) {
    const std::string& path = paths[i];
    STOKER_ASSIGN_OR_RETURN(auto mapped, fs.Map(path));
    auto bytes = mapped->data();
    const std::uint32_t shard = builder.AddShard(fs_std::absolute(path).lexically_proximate(index_dir).string());
    Status s = wds::ForEachSample(
        bytes, path,
        [&](const wds::TarSample& ts) -> Status {
          std::vector<const wds::TarSample::Field*> sorted;
          for (const auto& f : ts.fields) sorted.push_back(&f);
          std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
          Xxh3Stream checksum;
          std::int64_t label = kNoLabel;
          fields.clear();
          restarts.resize(sorted.size());
          for (const auto* f : sorted) {
            auto data = bytes.subspan(f->data_offset, f->size);
            checksum.Update(data);
            const FieldKind kind = ConventionalFieldKind(f->name);
            if (check != nullptr) {
              auto checked = check->Check({ts.key, f->name, kind}, data);
              if (!checked.ok())
                return checked.error().WithContext(
                    fmt::format("{}:{}: sample '{}', field '{}'", path, f->header_offset, ts.key, f->name));
            }
            SeekableTable& table = restarts[fields.size()];
            table = {};
            if (find_restarts) {
              if (auto found = find_restarts(f->name, data)) {
                table = std::move(*found);
                summary.seekable_payloads++;
              }
            }
            fields.push_back(
                {f->name, f->data_offset, f->size, index_format::KindCode(kind), table.offsets, table.geometry, data});
            if (f->name == "cls") {
              auto parsed = wds::ParseLabel({reinterpret_cast<const char*>(data.data()), data.size()});
              if (!parsed) {
                return Status::Corruption(
                    fmt::format("{}:{}: sample '{}': .cls is not a decimal integer", path, f->header_offset, ts.key));
              }
              label = *parsed;
            }
          }
          return builder.AddSample(shard, ts.key, label, checksum.Digest(), fields);
        },
        [&](const wds::SkippedMember& m) {
          if (summary.skipped_members++ < kNamedSkips)
            summary.warnings.push_back(fmt::format("{}:{}: member '{}' left out as WebDataset leaves it out ({})", path,
                                                   m.header_offset, Printable(m.name), m.why));
        });
    STOKER_RETURN_IF_ERROR(s);
    builder.SetShardContents(shard, bytes.size(), Xxh3(bytes));
    summary.shard_bytes += bytes.size();
    summary.shards++;
    if (options.on_progress) options.on_progress(i + 1, paths.size());
  }
  if (summary.skipped_members > kNamedSkips)
    summary.warnings.push_back(fmt::format("... and {} more members left out as WebDataset leaves them out",
                                           summary.skipped_members - kNamedSkips));
  summary.samples = builder.num_samples();
  builder.SetSkippedMembers(summary.skipped_members);
  if (check != nullptr) {
    builder.SetNote(check->Note());
    summary.bad_images_kept = check->kept();
    summary.bad_images_named = check->named();
  }
  STOKER_RETURN_IF_ERROR(
      WriteIndexFile(fs, summary.index_path, [&](index_format::ByteSink& out) { return builder.FinishTo(out); }));
  return summary;
}

}  // namespace stoker::index_internal
