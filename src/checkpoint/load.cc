// Reading checkpoints: list, validate (every safetensors rule, every
// checksum), map tensors copy-on-write, and find the newest complete one.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/load_counted.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/structure_check.h"
#include "core/hash.h"
#include "stoker/checkpoint.h"

namespace stoker {
namespace {

struct StepEntry {
  std::int64_t step;
  std::string path;
};

Result<std::vector<StepEntry>> StepDirectories(FileSystem& fs, const std::string& directory) {
  auto entries = fs.ListDirectory(directory);
  if (!entries.ok()) return entries.error().WithContext("listing checkpoints");
  std::vector<StepEntry> steps;
  for (const auto& e : *entries) {
    if (e.type != FileType::kDirectory) continue;
    if (auto step = checkpoint::ParseStepDirectoryName(e.name)) steps.push_back({*step, directory + "/" + e.name});
  }
  std::sort(steps.begin(), steps.end(), [](const StepEntry& a, const StepEntry& b) { return a.step < b.step; });
  return steps;
}

std::string Trimmed(std::string directory) {
  while (directory.size() > 1 && directory.back() == '/') directory.pop_back();
  return directory;
}

}  // namespace

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& directory_in, FileSystem* file_system) {
  FileSystem& fs = file_system ? *file_system : *FileSystem::Default();
  const std::string directory = Trimmed(directory_in);
  STOKER_ASSIGN_OR_RETURN(auto steps, StepDirectories(fs, directory));
  std::vector<CheckpointInfo> out;
  for (const auto& s : steps) {
    auto manifest = checkpoint::ReadManifest(fs, s.path);
    if (!manifest.ok()) continue;  // not a checkpoint stoker can read; left alone
    CheckpointInfo info;
    info.step = s.step;
    info.path = s.path;
    for (const auto& f : manifest->files) info.bytes += f.bytes;
    info.metric = manifest->extras.metric;
    out.push_back(std::move(info));
  }
  return out;
}

Result<LoadedCheckpoint> LoadCheckpoint(const std::string& step_directory, const LoadOptions& options) {
  return checkpoint::LoadCheckpointCounted(step_directory, options, nullptr);
}

Result<LoadedCheckpoint> checkpoint::LoadCheckpointCounted(const std::string& step_directory_in,
                                                           const LoadOptions& options, safetensors::ParseWork* work) {
  FileSystem& fs = options.file_system ? *options.file_system : *FileSystem::Default();
  const std::string step_directory = Trimmed(step_directory_in);
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(fs, step_directory, work));
  if (!manifest.sharded_json.empty())
    return Status::FailedPrecondition(
        fmt::format("'{}' is a sharded checkpoint (written by several ranks): read it with ShardedCheckpoint::Open "
                    "(Python: stoker.load_latest / load_checkpoint, which assemble it)",
                    step_directory));
  const auto slash = step_directory.rfind('/');
  const std::string folder = slash == std::string::npos ? step_directory : step_directory.substr(slash + 1);
  const auto named = checkpoint::ParseStepDirectoryName(folder);
  if (folder.starts_with("step-") && !named)
    return Status::Corruption(
        fmt::format("'{}' is not a checkpoint folder name: step-N, N a non-negative integer "
                    "without leading zeros (its manifest says step {})",
                    step_directory, manifest.step));
  if (named && *named != manifest.step)
    return Status::Corruption(
        fmt::format("'{}' is named step {} but its manifest says step {} (a folder renamed or "
                    "copied over another?)",
                    step_directory, *named, manifest.step));
  LoadedCheckpoint out;
  out.step = manifest.step;
  out.path = step_directory;
  out.extras = std::move(manifest.extras);
  std::vector<std::size_t> tensor_file;  // per tensor: its file's index in the manifest
  std::string index_text;
  for (std::size_t file_index = 0; file_index < manifest.files.size(); ++file_index) {
    const checkpoint::ManifestFile& f = manifest.files[file_index];
    const std::string path = step_directory + "/" + f.name;
    auto mapped = fs.Map(path, MapAccess::kCopyOnWrite);
    if (!mapped.ok()) {
      if (mapped.error().code() == StatusCode::kNotFound)
        return Status::Corruption(
            fmt::format("checkpoint '{}' is missing '{}' named in its manifest", step_directory, f.name));
      return mapped.error();
    }
    auto& file = *mapped;
    const auto data = file->writable_data();
    if (file->data().size() != f.bytes)
      return Status::Corruption(fmt::format("'{}' has {} bytes; the manifest says {} (truncated or replaced)", path,
                                            file->data().size(), f.bytes));
    if (options.verify_checksums && Xxh3(file->data()) != f.xxh3)
      return Status::Corruption(
          fmt::format("'{}' fails its xxh3 checksum: the file's bytes changed after it was written", path));
    if (f.name == checkpoint::kIndexName) {
      index_text.assign(reinterpret_cast<const char*>(file->data().data()), file->data().size());
    } else {
      STOKER_ASSIGN_OR_RETURN(auto parsed, safetensors::Parse(file->data(), path, work));
      for (auto& t : parsed.tensors) {
        out.tensors.push_back({std::move(t.name), t.dtype, std::move(t.shape),
                               data.subspan(parsed.data_offset + t.begin, t.end - t.begin)});
        tensor_file.push_back(file_index);
      }
    }
    out.mappings.push_back(std::move(file));
  }
  // Built once every tensor is in place: the views stay valid.
  checkpoint::TensorIndex by_name;
  by_name.reserve(out.tensors.size());
  for (std::size_t i = 0; i < out.tensors.size(); ++i) {
    if (work) ++work->name_lookups;
    if (!by_name.emplace(out.tensors[i].name, i).second)
      return Status::Corruption(
          fmt::format("tensor '{}' appears in two files of '{}'", out.tensors[i].name, step_directory));
  }
  STOKER_RETURN_IF_ERROR(checkpoint::CheckStructure(out.extras.user_json, by_name, step_directory, work));
  if (out.tensors.size() != manifest.tensor_count)
    return Status::Corruption(fmt::format("checkpoint '{}' holds {} tensors; its manifest says {}", step_directory,
                                          out.tensors.size(), manifest.tensor_count));
  if (!index_text.empty()) {
    if (work) work->json_bytes += index_text.size();
    auto index = nlohmann::json::parse(index_text, nullptr, false);
    const std::string where = step_directory + "/" + std::string(checkpoint::kIndexName);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return Status::Corruption(fmt::format("'{}' has no weight_map object", where));
    const auto& map = index["weight_map"];
    if (map.size() != by_name.size())
      return Status::Corruption(
          fmt::format("'{}' maps {} tensors; the files hold {}", where, map.size(), by_name.size()));
    for (auto entry = map.begin(); entry != map.end(); ++entry) {
      if (work) ++work->name_lookups;
      const auto found = by_name.find(entry.key());
      if (found == by_name.end())
        return Status::Corruption(
            fmt::format("'{}' maps tensor '{}', which none of the files holds", where, entry.key()));
      const std::string& file = manifest.files[tensor_file[found->second]].name;
      if (!entry.value().is_string() || entry.value().get<std::string>() != file)
        return Status::Corruption(fmt::format("'{}' does not map tensor '{}' to '{}'", where, entry.key(), file));
    }
  }
  return out;
}

Result<LoadedCheckpoint> LoadSafetensorsFile(const std::string& path, FileSystem* file_system) {
  FileSystem& fs = file_system ? *file_system : *FileSystem::Default();
  STOKER_ASSIGN_OR_RETURN(auto file, fs.Map(path, MapAccess::kCopyOnWrite));
  STOKER_ASSIGN_OR_RETURN(auto parsed, safetensors::Parse(file->data(), path));
  LoadedCheckpoint out;
  out.step = -1;
  out.path = path;
  out.extras.metadata = std::move(parsed.metadata);
  const auto data = file->writable_data();
  for (auto& t : parsed.tensors)
    out.tensors.push_back(
        {std::move(t.name), t.dtype, std::move(t.shape), data.subspan(parsed.data_offset + t.begin, t.end - t.begin)});
  out.mappings.push_back(std::move(file));
  return out;
}

Result<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& directory_in, const LoadOptions& options) {
  FileSystem& fs = options.file_system ? *options.file_system : *FileSystem::Default();
  const std::string directory = Trimmed(directory_in);
  STOKER_ASSIGN_OR_RETURN(auto steps, StepDirectories(fs, directory));
  std::vector<std::string> skipped;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    auto loaded = LoadCheckpoint(it->path, options);
    if (loaded.ok()) {
      loaded->skipped = std::move(skipped);
      return loaded;
    }
    if (!options.skip_corrupt || loaded.error().code() != StatusCode::kCorruption) {
      return loaded.error().WithContext(fmt::format("the newest checkpoint in '{}' cannot be loaded{}", directory,
                                                    loaded.error().code() == StatusCode::kCorruption
                                                        ? " (load with skip_corrupt to fall back to an older one)"
                                                        : ""));
    }
    skipped.push_back(fmt::format("{}: {}", it->path, loaded.error().message()));
  }
  if (!skipped.empty())
    return Status::Corruption(
        fmt::format("no complete checkpoint in '{}': every one is corrupt ({})", directory, fmt::join(skipped, "; ")));
  return Status::NotFound(fmt::format("no checkpoint in '{}'", directory));
}

}  // namespace stoker
