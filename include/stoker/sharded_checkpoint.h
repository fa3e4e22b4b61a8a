// stoker/sharded_checkpoint.h: reading checkpoints written by several ranks.
//
// A sharded checkpoint (CheckpointOptions::world_size > 1) is a step-N
// folder whose manifest.json maps every tensor, by name and global shape, to
// the pieces the ranks wrote (a rank's piece: offsets and shape within the
// global tensor, a file and a byte offset). ReadRegion() copies any box of a
// tensor, reading only the bytes of the pieces it overlaps, in blocks of
// block_bytes each checked against its xxh3 before use: a job restarted
// under another world size or another shard layout reads just its slices.
// The format is specified in docs/checkpoint.md, "Sharded checkpoints".
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/checkpoint.h"
#include "stoker/file_system.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker {

struct ShardPiece {
  std::uint32_t rank = 0;  // the rank that wrote it
  std::string file;        // in the step folder
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // byte offset of its data in `file`
};

struct ShardedTensorInfo {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::uint64_t> shape;  // global
  std::vector<ShardPiece> pieces;    // tile `shape` exactly
};

// A region of a tensor to read into caller memory (contiguous, row-major,
// of the region's shape).
struct RegionRequest {
  std::string_view name;
  std::span<const std::uint64_t> offsets;  // empty: all zeros
  std::span<const std::uint64_t> shape;    // empty: the tensor's (a scalar's is empty too)
  std::span<std::byte> out;
};

struct ShardedReadStats {
  std::uint64_t bytes_read = 0;      // from the files, blocks checked and unchecked
  std::uint64_t blocks_checked = 0;  // xxh3 verifications
};

class ShardedCheckpoint {
 public:
  // Reads and validates the manifest: files present with their sizes,
  // pieces inside their files and tiling their tensors (no gap, no overlap).
  // Corruption naming the folder, file and tensor otherwise;
  // FailedPrecondition when `step_directory` is a plain checkpoint.
  [[nodiscard]] static Result<std::unique_ptr<ShardedCheckpoint>> Open(const std::string& step_directory,
                                                                       const LoadOptions& options = {});
  // The same, keeping `file_system` (options.file_system) alive with it.
  [[nodiscard]] static Result<std::unique_ptr<ShardedCheckpoint>> Open(const std::string& step_directory,
                                                                       const LoadOptions& options,
                                                                       std::shared_ptr<FileSystem> file_system);
  ~ShardedCheckpoint();
  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  [[nodiscard]] std::int64_t step() const;
  [[nodiscard]] std::uint32_t world_size() const;  // of the job that wrote it
  [[nodiscard]] const std::string& path() const;
  [[nodiscard]] const std::vector<ShardedTensorInfo>& tensors() const;  // sorted by name
  [[nodiscard]] const ShardedTensorInfo* Find(std::string_view name) const;
  // What rank `rank` saved beside its tensors (loader state, RNG states,
  // metadata, its state's structure in user_json). Reads and checks its
  // rank-RRRRR.json.
  [[nodiscard]] Result<CheckpointExtras> RankExtras(std::uint32_t rank) const;

  // Fills each request's `out` with its region, on up to `threads` threads
  // (0: up to 4). InvalidArgument for an unknown name, a region outside the
  // tensor or an `out` of the wrong size; Corruption naming file, block and
  // tensor when a block fails its checksum (with verify_checksums).
  [[nodiscard]] Status ReadRegions(std::span<const RegionRequest> requests, std::uint32_t threads = 0);
  [[nodiscard]] ShardedReadStats stats() const;
  // Reads every file once, 4 MiB at a time, checking each block's and each
  // file's xxh3 (what `stoker checkpoint verify` does); Corruption naming
  // the file (and block) otherwise.
  [[nodiscard]] Status VerifyFiles();

  struct Impl;
  explicit ShardedCheckpoint(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// A sharded checkpoint at `location`: a local step-N folder, or the URL
// (http://, https://, s3://) of a step-N folder or of a checkpoint directory,
// whose `latest` then names the step. Remote files are read by range
// through the shard cache in chunks of one checksum block each, so a reader
// fetches only the blocks its regions touch.
[[nodiscard]] Result<std::unique_ptr<ShardedCheckpoint>> OpenShardedCheckpointAt(const std::string& location,
                                                                                 const LoadOptions& load = {},
                                                                                 const RemoteOptions& remote = {});

// Whether `step_directory`'s manifest is a sharded checkpoint's.
[[nodiscard]] Result<bool> IsShardedCheckpoint(const std::string& step_directory, FileSystem* file_system = nullptr);

}  // namespace stoker
