#include "checkpoint/sharded_persist.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "checkpoint/sharded_manifest.h"
#include "core/hash.h"

namespace stoker::checkpoint {
namespace {

// Makes the shared temporary folder, or checks that the one another rank
// made is a folder and not a link planted there.
Status EnsureTempFolder(FileSystem& fs, const std::string& temp) {
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(temp));
  STOKER_ASSIGN_OR_RETURN(FileInfo info, fs.LinkStat(temp));
  if (info.type != FileType::kDirectory)
    return Status::FailedPrecondition(fmt::format("'{}' is not a folder (a link?): not writing through it", temp));
  return Status::Ok();
}

Status WriteSmallFileAtomically(FileSystem& fs, const std::string& temp, const std::string& name, std::string_view text,
                                ManifestFile* out) {
  const std::string staging = temp + "/." + name + ".partial";
  (void)fs.Remove(staging);
  STOKER_RETURN_IF_ERROR(WriteHashedFile(fs, staging, name, std::as_bytes(std::span(text)), {}, out));
  STOKER_RETURN_IF_ERROR(fs.Rename(staging, temp + "/" + name));
  return fs.SyncDirectory(temp);
}

}  // namespace

Status PersistRankPart(FileSystem& fs, const std::string& temp, const PersistJob& job, const HostBuffer& arena,
                       const ShardedSaveInfo& info, std::uint64_t* bytes_written) {
  STOKER_RETURN_IF_ERROR(EnsureTempFolder(fs, temp));
  RankPart part;
  part.rank = info.rank;
  part.world_size = info.world_size;
  part.save_id = info.save_id;
  part.block_bytes = kBlockBytes;
  part.base.step = job.step;
  part.base.extras = job.extras;
  part.base.tensor_bytes = job.plan.tensor_bytes;
  part.base.created_unix_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, std::string> file_metadata = job.extras.metadata;
  file_metadata.try_emplace("format", "pt");
  file_metadata["stoker.rank"] = std::to_string(info.rank);
  std::uint64_t written = 0;
  for (const auto& file : job.plan.files) {
    STOKER_ASSIGN_OR_RETURN(std::string header, safetensors::EncodeHeader(file.tensors, file_metadata));
    ManifestFile record;
    std::vector<std::uint64_t> blocks;
    STOKER_RETURN_IF_ERROR(WriteHashedFile(fs, temp + "/" + file.name, file.name, std::as_bytes(std::span(header)),
                                           std::span<const std::byte>(arena.data() + file.arena_offset, file.bytes),
                                           &record, part.block_bytes, &blocks));
    written += record.bytes;
    part.blocks.emplace(file.name, std::move(blocks));
    part.base.files.push_back(std::move(record));
    part.base.tensor_count += file.tensors.size();
    for (std::size_t k = 0; k < file.tensors.size(); ++k) {
      const TensorRef& ref = job.pieces.at(file.sources[k]);
      const bool whole = ref.global_shape.empty();
      part.pieces.push_back({ref.name, file.name, ref.dtype, whole ? ref.shape : ref.global_shape,
                             whole ? std::vector<std::uint64_t>(ref.shape.size(), 0) : ref.global_offsets, ref.shape,
                             header.size() + file.tensors[k].begin});
    }
  }
  // The data files are durable; the folder entry of each is made durable
  // with the part's own fsync of the folder below.
  STOKER_ASSIGN_OR_RETURN(std::string text, EncodeRankPart(part));
  ManifestFile record;
  STOKER_RETURN_IF_ERROR(WriteSmallFileAtomically(fs, temp, RankPartName(info.rank), text, &record));
  *bytes_written += written + record.bytes;
  return Status::Ok();
}

void RecordRankFailure(FileSystem& fs, const std::string& temp, std::uint32_t rank, const Status& why) {
  if (!EnsureTempFolder(fs, temp).ok()) return;
  ManifestFile unused;
  (void)WriteSmallFileAtomically(fs, temp, RankFailedName(rank), why.ToString(), &unused);
}

Status CommitShardedCheckpoint(FileSystem& fs, const std::string& directory, const std::string& temp, std::int64_t step,
                               const ShardedSaveInfo& info, double timeout_seconds, Clock& clock,
                               bool replace_existing) {
  const std::uint32_t world = info.world_size;
  std::vector<RankPart> parts(world);
  std::vector<ManifestFile> part_files(world);
  std::vector<bool> have(world, false);
  std::uint32_t missing = world;
  const auto start = clock.Now();
  auto poll = std::chrono::milliseconds(2);
  for (;;) {
    for (std::uint32_t r = 0; r < world; ++r) {
      if (have[r]) continue;
      const std::string part_path = temp + "/" + RankPartName(r);
      auto bytes = ReadWholeFile(fs, part_path);
      if (!bytes.ok()) {
        if (bytes.error().code() != StatusCode::kNotFound) return bytes.error();
        auto failed = ReadWholeFile(fs, temp + "/" + RankFailedName(r));
        if (failed.ok())
          return Status::Unavailable(
              fmt::format("rank {} failed to persist its part of step {}: {}", r, step,
                          std::string_view(reinterpret_cast<const char*>(failed->data()), failed->size())));
        continue;
      }
      const std::string_view text(reinterpret_cast<const char*>(bytes->data()), bytes->size());
      STOKER_ASSIGN_OR_RETURN(parts[r], DecodeRankPart(text, part_path));
      part_files[r] = {RankPartName(r), bytes->size(), Xxh3(*bytes)};
      have[r] = true;
      --missing;
    }
    if (missing == 0) break;
    if (SecondsBetween(start, clock.Now()) > timeout_seconds) {
      std::vector<std::uint32_t> late;
      for (std::uint32_t r = 0; r < world; ++r)
        if (!have[r]) late.push_back(r);
      return Status::DeadlineExceeded(fmt::format(
          "step {} was not published: rank(s) {} did not make their files durable within {} s of rank 0 (dead, hung, "
          "or saving another step?); the previous checkpoint stays the newest",
          step, fmt::join(late, ", "), timeout_seconds));
    }
    clock.SleepFor(poll);
    poll = std::min<std::chrono::milliseconds>(poll * 2, std::chrono::milliseconds(50));
  }
  STOKER_ASSIGN_OR_RETURN(Manifest manifest, MergeRankParts(parts, part_files, temp));
  manifest.step = step;
  STOKER_ASSIGN_OR_RETURN(std::string text, EncodeManifest(manifest));
  ManifestFile unused;
  STOKER_RETURN_IF_ERROR(WriteSmallFileAtomically(fs, temp, std::string(kManifestName), text, &unused));
  return PublishFolder(fs, directory, temp, step, replace_existing);
}

Status RemoveStaleTemporaries(FileSystem& fs, const std::string& directory, std::string_view keep) {
  STOKER_ASSIGN_OR_RETURN(auto entries, fs.ListDirectory(directory));
  for (const auto& e : entries) {
    if (e.name == keep) continue;
    if (e.name.starts_with(kTempPrefix) || e.name.starts_with(std::string(kLatestName) + ".tmp"))
      STOKER_RETURN_IF_ERROR(RemoveTree(fs, directory + "/" + e.name).WithContext("removing a leftover temporary"));
  }
  return Status::Ok();
}

}  // namespace stoker::checkpoint
