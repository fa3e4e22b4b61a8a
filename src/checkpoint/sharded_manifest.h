// The two manifests of a sharded checkpoint (docs/checkpoint.md, "Sharded
// checkpoints"), both in manifest.h's format with a "sharded" member:
//  - rank-RRRRR.json, one per rank, written last by that rank once its
//    files are durable: its files (xxh3 of each and of every block), the
//    pieces it wrote, and its extras (loader state, RNG, structure);
//  - manifest.json, written by rank 0 from all the parts: every file, and
//    every tensor's global shape and pieces. Its presence in a step-N folder
//    is what makes the checkpoint complete.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "stoker/sharded_checkpoint.h"

namespace stoker::checkpoint {

// Files are checksummed per block as well as whole, so that a reader of a
// few slices checks just the blocks it reads.
inline constexpr std::uint64_t kBlockBytes = std::uint64_t{4} << 20;

[[nodiscard]] std::string RankStem(std::uint32_t rank);        // "rank-00003"
[[nodiscard]] std::string RankPartName(std::uint32_t rank);    // "rank-00003.json"
[[nodiscard]] std::string RankFailedName(std::uint32_t rank);  // "rank-00003.failed"
// The shared temporary folder of one collective save.
[[nodiscard]] std::string ShardedTempName(std::int64_t step, std::string_view save_id);
// Letters, digits, '-' and '_', 1 to 64 of them.
[[nodiscard]] bool ValidSaveId(std::string_view save_id);

struct PieceRecord {
  std::string name;  // the tensor's
  std::string file;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::uint64_t> global_shape;
  std::vector<std::uint64_t> offsets;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // byte offset in `file`
};

using BlockHashes = std::map<std::string, std::vector<std::uint64_t>>;  // file -> xxh3 per block

struct RankPart {
  Manifest base;  // step, this rank's files, tensor_count/bytes of its pieces, its extras
  std::uint32_t rank = 0;
  std::uint32_t world_size = 1;
  std::string save_id;
  std::uint64_t block_bytes = kBlockBytes;
  BlockHashes blocks;
  std::vector<PieceRecord> pieces;
};

[[nodiscard]] Result<std::string> EncodeRankPart(const RankPart& part);
[[nodiscard]] Result<RankPart> DecodeRankPart(std::string_view text, std::string_view path);

// The global manifest's "sharded" member.
struct ShardedLayout {
  std::uint32_t world_size = 1;
  std::string save_id;
  std::uint64_t block_bytes = kBlockBytes;
  std::vector<ShardedTensorInfo> tensors;  // sorted by name
  BlockHashes blocks;
};

[[nodiscard]] std::string EncodeShardedLayout(const ShardedLayout& layout);
[[nodiscard]] Result<ShardedLayout> DecodeShardedLayout(std::string_view text, std::string_view path);

// Every piece inside the tensor, no two overlapping, together covering it.
// Corruption naming the tensor and `where` otherwise.
[[nodiscard]] Status CheckTiling(const ShardedTensorInfo& tensor, std::string_view where);

// The global manifest from every rank's part (parts[r] is rank r's), with
// the parts themselves listed among the files (`part_files`, their sizes
// and xxh3). Checks that the parts agree (step, save id, world size, each
// tensor's dtype and global shape) and that the pieces tile every tensor.
[[nodiscard]] Result<Manifest> MergeRankParts(const std::vector<RankPart>& parts,
                                              const std::vector<ManifestFile>& part_files, std::string_view where);

}  // namespace stoker::checkpoint
