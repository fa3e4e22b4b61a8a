// Internals of stoker::Dataset shared by the dataset layer's files.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/mutex.h"
#include "format/index_format.h"
#include "stoker/dataset.h"

namespace stoker {

struct Dataset::Impl {
  // A file system the dataset keeps alive (a remote one; declared first:
  // destroyed last, after the shard files that read through it).
  std::shared_ptr<FileSystem> owned_fs;
  FileSystem* fs = nullptr;
  std::string index_path;  // as printed (FileSystem::DisplayName)
  std::unique_ptr<MappedFile> mapped;
  std::vector<std::byte> in_memory_index;  // OpenImageFolder: the index built in memory
  // OpenImageFolder: shards are loose files, too many to keep open; each read
  // opens and closes its file.
  bool loose = false;
  index_format::IndexView view;
  std::vector<std::string> class_names;  // from the note (packed) or the folders (loose)
  std::uint64_t bad_images_kept = 0;     // from the note: --keep-bad-images
  std::string first_bad_image;
  std::vector<ShardInfo> shards;

  // Opens shard files lazily, once each (packed datasets only).
  [[nodiscard]] Result<ReadableFile*> Shard(std::uint32_t shard) const EXCLUDES(mu);
  // A file to read shard `shard` through: the cached one (packed), or one
  // opened for this read into `owner` (loose files).
  [[nodiscard]] Result<ReadableFile*> ShardForRead(std::uint32_t shard, std::unique_ptr<ReadableFile>& owner) const;
  std::optional<std::size_t> cls_field;  // the "cls" field, whose payload is the label
  [[nodiscard]] std::optional<std::size_t> FieldIndex(std::string_view name) const {
    const auto& names = view.field_names();
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == name) return i;
    return std::nullopt;
  }
  // "field 'jpg' of sample 'k' at shard-000000.tar:1536", for messages.
  [[nodiscard]] std::string Where(const SampleInfo& info, std::size_t field) const;
  mutable Mutex mu;
  mutable std::vector<std::unique_ptr<ReadableFile>> open_shards GUARDED_BY(mu);
  // Dataset::AdviseShardAccess: given to every shard opened from now on.
  mutable AccessPattern shard_access GUARDED_BY(mu) = AccessPattern::kNormal;
};

}  // namespace stoker
