// Where packed samples go: tar shards of about a target size, written under
// temporary names and published by rename, and the index, written last.
// Shared by `stoker pack` and DatasetWriter.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/hash.h"
#include "core/owner_process.h"
#include "dataset/taken_keys.h"
#include "format/index_format.h"
#include "stoker/fields.h"
#include "stoker/file_system.h"
#include "stoker/pack.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::pack_internal {

// "shard-NNNNNN.tar".
[[nodiscard]] std::string ShardName(std::uint64_t i);

// A key goes into tar member names, so it must be a relative path that
// stays inside the archive's folder and prints on one line. `origin` says
// where the sample came from, for the message.
[[nodiscard]] Status ValidateKey(std::string_view key, std::string_view origin);

class ShardSink {
 public:
  // InvalidArgument for a target shard size below 4096 bytes (Create checks
  // it; Pack asks first, before listing a large source).
  [[nodiscard]] static Status CheckTargetShardBytes(std::uint64_t target_shard_bytes);

  // Makes `out_dir` ready: with `overwrite`, removes an old index first (so
  // the folder stops looking complete). Without it, refuses a folder
  // holding an index or shard files of our naming, which this sink would
  // overwrite or leave mixed with its own; nothing is deleted that this run
  // did not create, except the temporaries of stoker runs that died (their
  // exact names, dead writer pid). `force_hint` is how the caller's user
  // asks for a replace ("pass --force", "pass overwrite=True").
  [[nodiscard]] static Result<std::unique_ptr<ShardSink>> Create(FileSystem& fs, std::string out_dir,
                                                                 std::uint64_t target_shard_bytes, bool overwrite,
                                                                 std::string_view force_hint);
  ShardSink(const ShardSink&) = delete;
  ShardSink& operator=(const ShardSink&) = delete;
  // Unfinished (an error, or the writer dropped): removes the open shard's
  // temporary and the shards this sink published, and writes no index, so
  // the folder never opens as a half-written dataset. A copy in a forked
  // child (multiprocessing with "fork") removes nothing, and its Add() and
  // Finish() fail: the folder is its creator's.
  ~ShardSink();

  struct Field {
    std::string_view name;  // WebDataset field, e.g. "jpg", "mask.png"
    std::span<const std::byte> bytes;
    FieldKind content = FieldKind::kBytes;  // what the index records
    const SeekableTable* restarts = nullptr;
  };
  // Appends one sample: its fields, sorted by name, become tar members
  // "<key>.<field>". A new shard starts when this sample would take the
  // current one past the target size. A key or field given twice is an
  // error that leaves the sink as it was; a failed write (I/O) breaks it:
  // Add() and Finish() then fail.
  [[nodiscard]] Status Add(std::string_view key, std::int64_t label, std::span<const Field> fields);

  [[nodiscard]] std::uint64_t samples() const { return builder_.num_samples(); }
  [[nodiscard]] std::uint64_t payload_bytes() const { return payload_bytes_; }

  // Ends the last shard, syncs the folder and writes the index with `note`
  // (JSON; empty for none). Fills samples, shards, shard_bytes,
  // payload_bytes and index_path. With `overwrite`, shards numbered past
  // the last one (an earlier, larger dataset's) are removed.
  [[nodiscard]] Result<PackSummary> Finish(std::string note);

 private:
  ShardSink(FileSystem& fs, std::string out_dir, std::uint64_t target_shard_bytes, bool overwrite);
  [[nodiscard]] Status FinishShard();
  [[nodiscard]] Status CheckOwner() const;
  [[nodiscard]] Status Write(std::string_view key, std::int64_t label, std::span<const Field> fields,
                             std::span<const std::string> headers, std::uint64_t sample_bytes);

  FileSystem* fs_;
  std::string out_dir_;
  std::uint64_t target_shard_bytes_;
  bool overwrite_;
  index_format::IndexBuilder builder_;
  std::optional<AtomicFile> file_;  // the shard being written
  std::uint64_t offset_ = 0;        // its size so far
  Xxh3Stream hash_;                 // of its bytes so far
  std::uint32_t shard_id_ = 0;
  std::uint64_t shards_published_ = 0;
  std::uint64_t shard_bytes_ = 0;
  std::uint64_t payload_bytes_ = 0;
  TakenKeys taken_keys_;
  bool finished_ = false;
  OwnerProcess owner_;  // a forked child's copy writes nothing and removes nothing
  Status broken_;       // the write error that left a shard half-written
};

}  // namespace stoker::pack_internal
