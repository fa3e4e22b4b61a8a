// Internals of stoker::Dataset shared by the dataset layer's files.
#pragma once

#include <memory>
#include <vector>

#include "core/mutex.h"
#include "format/index_format.h"
#include "stoker/dataset.h"

namespace stoker {

struct Dataset::Impl {
  FileSystem* fs = nullptr;
  std::string index_path;
  std::unique_ptr<MappedFile> mapped;
  index_format::IndexView view;
  std::vector<ShardInfo> shards;

  // Opens shard files lazily, once each.
  [[nodiscard]] Result<ReadableFile*> Shard(std::uint32_t shard) const EXCLUDES(mu);
  mutable Mutex mu;
  mutable std::vector<std::unique_ptr<ReadableFile>> open_shards GUARDED_BY(mu);
};

}  // namespace stoker
