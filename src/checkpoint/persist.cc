#include "checkpoint/persist.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"
#include "core/hash.h"

namespace stoker::checkpoint {

Status WriteHashedFile(FileSystem& fs, const std::string& path, std::string_view name, std::span<const std::byte> head,
                       std::span<const std::byte> body, ManifestFile* out, std::uint64_t block_bytes,
                       std::vector<std::uint64_t>* blocks) {
  STOKER_ASSIGN_OR_RETURN(auto file, fs.CreateForWrite(path, CreateMode::kExclusive));
  Xxh3Stream hash;
  Xxh3Stream block;
  std::uint64_t in_block = 0;
  if (blocks) blocks->clear();
  // Hashes a span into the whole-file hash and, cut at block boundaries, the block hashes.
  auto digest = [&](std::span<const std::byte> data) {
    hash.Update(data);
    if (!blocks) return;
    while (!data.empty()) {
      const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(data.size(), block_bytes - in_block));
      block.Update(data.first(n));
      data = data.subspan(n);
      in_block += n;
      if (in_block == block_bytes) {
        blocks->push_back(block.Digest());
        block = Xxh3Stream();
        in_block = 0;
      }
    }
  };
  digest(head);
  STOKER_RETURN_IF_ERROR(file->Append(head));
  constexpr std::size_t kChunk = std::size_t{16} << 20;  // hash while the chunk is hot in cache
  for (std::size_t pos = 0; pos < body.size(); pos += kChunk) {
    auto chunk = body.subspan(pos, std::min(kChunk, body.size() - pos));
    digest(chunk);
    STOKER_RETURN_IF_ERROR(file->Append(chunk));
    STOKER_RETURN_IF_ERROR(file->StartWriteBack());  // the disk writes while we hash the next chunk
  }
  if (blocks && in_block > 0) blocks->push_back(block.Digest());
  STOKER_RETURN_IF_ERROR(file->Sync());
  STOKER_RETURN_IF_ERROR(file->Close());
  *out = {std::string(name), head.size() + body.size(), hash.Digest()};
  return Status::Ok();
}

Status PublishFolder(FileSystem& fs, const std::string& directory, const std::string& temp, std::int64_t step,
                     bool replace_existing) {
  // Publish: one rename makes the folder appear complete.
  const std::string name = StepDirectoryName(step);
  const std::string final_path = directory + "/" + name;
  std::string replaced;
  if (fs.LinkStat(final_path).ok()) {
    if (!replace_existing)
      return Status::AlreadyExists(
          fmt::format("'{}' exists already (a checkpoint of this step from an earlier run?); it was not replaced: set "
                      "replace_existing to overwrite it",
                      final_path));
    // Move the old folder aside under a temporary name, which a crash leaves for cleanup.
    replaced = fmt::format("{}/{}replaced-{}-{}", directory, kTempPrefix, name, ::getpid());
    STOKER_RETURN_IF_ERROR(fs.Rename(final_path, replaced));
  }
  STOKER_RETURN_IF_ERROR(fs.Rename(temp, final_path));
  STOKER_RETURN_IF_ERROR(fs.SyncDirectory(directory));
  const std::string latest = name + "\n";
  STOKER_RETURN_IF_ERROR(
      WriteWholeFileAtomically(fs, directory + "/" + std::string(kLatestName), std::as_bytes(std::span(latest))));
  if (!replaced.empty()) STOKER_RETURN_IF_ERROR(RemoveTree(fs, replaced));
  return Status::Ok();
}

Status PersistCheckpoint(FileSystem& fs, const std::string& directory, const PersistJob& work, const HostBuffer& arena,
                         const std::string& temp, bool replace_existing, std::uint64_t* bytes_written) {
  STOKER_RETURN_IF_ERROR(RemoveTree(fs, temp));
  STOKER_RETURN_IF_ERROR(fs.CreateDirectories(temp));
  Manifest manifest;
  manifest.step = work.step;
  manifest.extras = work.extras;
  manifest.tensor_bytes = work.plan.tensor_bytes;
  manifest.created_unix_seconds =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::map<std::string, std::string> file_metadata = work.extras.metadata;
  file_metadata.try_emplace("format", "pt");  // what Hugging Face loaders look for
  std::uint64_t written = 0;

  auto write_file = [&](const std::string& name, std::span<const std::byte> head,
                        std::span<const std::byte> body) -> Status {
    ManifestFile file;
    STOKER_RETURN_IF_ERROR(WriteHashedFile(fs, temp + "/" + name, name, head, body, &file));
    written += file.bytes;
    manifest.files.push_back(std::move(file));
    return Status::Ok();
  };

  nlohmann::json weight_map = nlohmann::json::object();
  for (const auto& file : work.plan.files) {
    STOKER_ASSIGN_OR_RETURN(std::string header, safetensors::EncodeHeader(file.tensors, file_metadata));
    STOKER_RETURN_IF_ERROR(write_file(file.name, std::as_bytes(std::span(header)),
                                      std::span<const std::byte>(arena.data() + file.arena_offset, file.bytes)));
    manifest.tensor_count += file.tensors.size();
    for (const auto& t : file.tensors) weight_map[t.name] = file.name;
  }
  if (work.plan.files.size() > 1) {
    // The Hugging Face convention for a state split across files.
    nlohmann::json index = {{"metadata", {{"total_size", work.plan.tensor_bytes}}}, {"weight_map", weight_map}};
    const std::string text = index.dump(2) + "\n";
    STOKER_RETURN_IF_ERROR(write_file(std::string(kIndexName), std::as_bytes(std::span(text)), {}));
  }
  STOKER_ASSIGN_OR_RETURN(std::string manifest_text, EncodeManifest(manifest));
  STOKER_RETURN_IF_ERROR(write_file(std::string(kManifestName), std::as_bytes(std::span(manifest_text)), {}));
  manifest.files.pop_back();  // (the manifest does not list itself)
  STOKER_RETURN_IF_ERROR(fs.SyncDirectory(temp));

  STOKER_RETURN_IF_ERROR(PublishFolder(fs, directory, temp, work.step, replace_existing));
  *bytes_written += written;
  return Status::Ok();
}

Status ApplyRetention(FileSystem& fs, const CheckpointOptions& options) {
  if (options.keep_last == 0) return Status::Ok();
  STOKER_ASSIGN_OR_RETURN(auto all, ListCheckpoints(options.directory, &fs));
  if (all.empty()) return Status::Ok();
  std::set<std::int64_t> keep;
  keep.insert(all.back().step);  // the newest complete checkpoint, always
  for (std::size_t i = all.size() > options.keep_last ? all.size() - options.keep_last : 0; i < all.size(); ++i)
    keep.insert(all[i].step);
  if (options.keep_best > 0) {
    std::vector<const CheckpointInfo*> ranked;
    for (const auto& c : all)
      if (c.metric) ranked.push_back(&c);
    std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo* a, const CheckpointInfo* b) {
      return options.higher_metric_is_better ? *a->metric > *b->metric : *a->metric < *b->metric;
    });
    for (std::size_t i = 0; i < ranked.size() && i < options.keep_best; ++i) keep.insert(ranked[i]->step);
  }
  for (const auto& c : all) {
    if (keep.contains(c.step)) continue;
    const std::string doomed =
        fmt::format("{}/{}deleting-step-{}-{}", options.directory, kTempPrefix, c.step, ::getpid());
    STOKER_RETURN_IF_ERROR(fs.Rename(c.path, doomed));
    STOKER_RETURN_IF_ERROR(RemoveTree(fs, doomed));
  }
  return Status::Ok();
}

}  // namespace stoker::checkpoint
