// The public IndexShards(): the dataset layer's indexer, with the codec's
// restart-table finder plugged in, so JPEGs written with restart intervals
// elsewhere (`jpegtran -restart`) are seekable as `pack --seekable-jpeg`
// makes them.
#include "codec/jpeg.h"
#include "codec/jpeg_restart.h"
#include "dataset/index_shards.h"
#include "stoker/pack.h"

namespace stoker {

Result<IndexSummary> IndexShards(const std::vector<std::string>& shard_patterns, const IndexOptions& options) {
  return index_internal::IndexShardsWith(
      shard_patterns, options,
      [](std::string_view field, std::span<const std::byte> payload) -> std::optional<SeekableTable> {
        if (!codec::IsJpegField(field)) return std::nullopt;
        auto table = codec::ExistingRestartTable(payload);
        if (!table) return std::nullopt;
        auto layout = codec::ReadScanLayout(payload);  // read once more: it is what the table was found with
        if (!layout.ok()) return std::nullopt;
        return SeekableTable{std::move(*table), codec::IndexGeometry(*layout)};
      });
}

}  // namespace stoker
