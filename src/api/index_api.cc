// The public IndexShards(): the dataset layer's indexer, with the codec's
// restart-table finder plugged in, so JPEGs written with restart intervals
// elsewhere (`jpegtran -restart`) are seekable as `pack --seekable-jpeg`
// makes them; and pack's image header check, so an image the loader cannot
// start to decode is named now, not in the training loop.
#include "codec/jpeg.h"
#include "codec/jpeg_restart.h"
#include "dataset/index_shards.h"
#include "prepare/image_check.h"
#include "stoker/pack.h"

namespace stoker {

Result<IndexSummary> IndexShards(const std::vector<std::string>& shard_patterns, const IndexOptions& options) {
  const prepare::ImageHeaderCheck check(options.keep_bad_images);
  return index_internal::IndexShardsWith(
      shard_patterns, options,
      [](std::string_view field, std::span<const std::byte> payload) -> std::optional<SeekableTable> {
        if (!codec::IsJpegField(field)) return std::nullopt;
        auto table = codec::ExistingRestartTable(payload);
        if (!table) return std::nullopt;
        auto layout = codec::ReadScanLayout(payload);  // read once more: it is what the table was found with
        if (!layout.ok()) return std::nullopt;
        return SeekableTable{std::move(*table), codec::IndexGeometry(*layout)};
      },
      &check);
}

}  // namespace stoker
