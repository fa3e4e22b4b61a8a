// `stoker index` with a seam for what the dataset layer cannot see: the
// restart tables of seekable JPEGs are found by the codec, a layer beside
// this one, and handed in by the public IndexShards() (src/api).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dataset/pack_rewrite.h"
#include "stoker/file_system.h"
#include "stoker/pack.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::index_internal {

// The restart table (and the image's geometry) to record for payload
// `payload` of field `field`, or nothing. Called for every payload; must be
// cheap for those it ignores.
using RestartTableFinder =
    std::function<std::optional<SeekableTable>(std::string_view field, std::span<const std::byte> payload)>;

// The `.tar` files directly in `folder` (regular files, links followed), in
// name order: what `stoker index FOLDER` indexes. Empty when there are none.
[[nodiscard]] Result<std::vector<std::string>> TarFilesIn(FileSystem& fs, const std::string& folder);

// IndexShards() with `find_restarts` (may be empty: no tables) and `check`
// (may be null: none), which sees every payload with the kind its name
// implies; a payload it refuses stops the index, named by shard:offset.
[[nodiscard]] Result<IndexSummary> IndexShardsWith(const std::vector<std::string>& shard_patterns,
                                                   const IndexOptions& options, const RestartTableFinder& find_restarts,
                                                   const pack_internal::PayloadCheck* check = nullptr);

}  // namespace stoker::index_internal
