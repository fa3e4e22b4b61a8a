// stoker/merge.h: one dataset from several written apart (a DatasetWriter
// per worker, pack runs over parts of a collection), by merging their
// indexes. The shards stay where they are.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker {

struct MergeOptions {
  // Replace an index already in the output folder.
  bool overwrite = false;
  FileSystem* file_system = FileSystem::Default();
  // Called after each part is scanned with (parts done, parts total); may
  // be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
  // Then, while the index is written (about half of a large merge's time),
  // with (bytes written, the index's size in bytes): after each 16 MiB and
  // at the end. May be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_write_progress;
};

struct MergeSummary {
  std::string index_path;  // the index written
  std::uint64_t parts = 0;
  std::uint64_t samples = 0;
  std::uint64_t shards = 0;
  std::uint64_t shard_bytes = 0;
  std::uint64_t seekable_payloads = 0;   // restart tables carried over
  std::vector<std::string> class_names;  // as every part that records names has them
};

// Writes `output`/index.stoker naming every shard and sample of `parts`
// (dataset folders or index files), in the order given: the parts' samples
// one part after another, each part's in its own order. The merged index
// is what indexing all their shards would give (fields, kinds widened
// across parts, labels, checksums, seekable JPEGs' restart tables), made
// from the parts' indexes alone (checked against their checksums): their
// shards are not read. Each part's own index stays valid.
//
// Every part must lie inside `output` (created when missing): the merged
// index names shards by paths relative to its folder, so that the folder
// moves, or is uploaded, whole. Refused, naming what: a part outside
// `output` or that is `output` itself; a shard two parts share; a sample
// key in two parts; parts whose class names differ; a part whose index is
// damaged, or holds seekable JPEGs indexed before index version 7 (re-index
// it); an index already in `output` without `overwrite`. The index is
// written atomically, streamed from the parts' mapped indexes: memory is
// about 16 bytes a sample (a hash of each key, to find one in two parts)
// and 4 a seekable JPEG, not the index (10 million samples: 156 MiB).
[[nodiscard]] Result<MergeSummary> MergeDatasets(const std::vector<std::string>& parts, const std::string& output,
                                                 const MergeOptions& options = {});

}  // namespace stoker
