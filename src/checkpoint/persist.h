// Persisting a snapshot (the checkpointer's background thread): in a
// temporary folder write each safetensors file from the arena in 16 MiB
// chunks, hashing and starting write-back as it goes, fsync; the HF index
// when split; then manifest.json; fsync the folder, rename it to step-N,
// fsync the parent, replace `latest` atomically. Retention runs after.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/manifest.h"
#include "checkpoint/snapshot.h"
#include "core/clock.h"
#include "stoker/checkpoint.h"
#include "stoker/file_system.h"

namespace stoker::checkpoint {

struct PersistJob {
  std::int64_t step = 0;
  SnapshotPlan plan;
  CheckpointExtras extras;
  // Sharded saves: the save's id, and the caller's tensors without their
  // data (names, shapes, global shapes and offsets), by source index.
  std::string save_id;
  std::vector<TensorRef> pieces;
  double stall_seconds = 0;
  Clock::TimePoint snapshot_done;
};

// Writes `head` then `body` to a new file (never through an existing one)
// in 16 MiB chunks, hashing and starting write-back as it goes, then fsyncs
// it. Fills `*out` with `name`, the size and the xxh3; with `blocks`, also
// the xxh3 of each `block_bytes` block of the file (the last one shorter).
[[nodiscard]] Status WriteHashedFile(FileSystem& fs, const std::string& path, std::string_view name,
                                     std::span<const std::byte> head, std::span<const std::byte> body,
                                     ManifestFile* out, std::uint64_t block_bytes = 0,
                                     std::vector<std::uint64_t>* blocks = nullptr);

// Publishes the complete folder `temp`: fsyncs it, renames it to
// directory/step-N (an existing step-N is moved aside first when
// `replace_existing`, AlreadyExists otherwise), fsyncs `directory`, then
// points `latest` at it atomically.
[[nodiscard]] Status PublishFolder(FileSystem& fs, const std::string& directory, const std::string& temp,
                                   std::int64_t step, bool replace_existing);

// Writes `job` from `arena` into `temp` (a new folder in `directory`) and
// publishes it as step-N. A step-N that exists already is replaced only
// when `replace_existing` (the old one is moved aside first, so a crash
// leaves one or the other). Adds the bytes written to `*bytes_written`.
[[nodiscard]] Status PersistCheckpoint(FileSystem& fs, const std::string& directory, const PersistJob& job,
                                       const HostBuffer& arena, const std::string& temp, bool replace_existing,
                                       std::uint64_t* bytes_written);

// Deletes what retention does not keep: the newest `keep_last` (0: keep
// all), the best `keep_best` by metric, and always the newest complete one.
// Each goes by rename to a temporary first, so a crash never leaves a
// half-deleted step folder.
[[nodiscard]] Status ApplyRetention(FileSystem& fs, const CheckpointOptions& options);

}  // namespace stoker::checkpoint
