// Reading checkpoints: list, validate (every safetensors rule, every
// checksum), map tensors copy-on-write, and find the newest complete one.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
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

// The Python package keeps the saved state's nested structure in the
// manifest's user JSON as {"structure": NODE}, where a NODE {"t": NAME}
// stands for the tensor NAME (docs/checkpoint.md). Every such name must be a
// tensor of the checkpoint, or loading would fail later without saying where.
Status CheckStructure(const std::string& user_json, const std::map<std::string, std::string>& tensors,
                      const std::string& where) {
  if (user_json.empty()) return Status::Ok();
  const auto user = nlohmann::json::parse(user_json, nullptr, false);
  if (user.is_discarded() || !user.is_object() || !user.contains("structure")) return Status::Ok();
  std::vector<const nlohmann::json*> stack = {&user["structure"]};
  while (!stack.empty()) {
    const nlohmann::json* node = stack.back();
    stack.pop_back();
    if (node->is_object()) {
      if (auto t = node->find("t"); t != node->end() && t->is_string() && !tensors.contains(t->get<std::string>()))
        return Status::Corruption(fmt::format(
            "checkpoint '{}': its manifest's state structure names tensor '{}', which none of its files holds", where,
            t->get<std::string>()));
      for (const auto& [key, value] : node->items()) stack.push_back(&value);
    } else if (node->is_array()) {
      for (const auto& value : *node) stack.push_back(&value);
    }
  }
  return Status::Ok();
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

Result<LoadedCheckpoint> LoadCheckpoint(const std::string& step_directory_in, const LoadOptions& options) {
  FileSystem& fs = options.file_system ? *options.file_system : *FileSystem::Default();
  const std::string step_directory = Trimmed(step_directory_in);
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(fs, step_directory));
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
  std::map<std::string, std::string> tensor_file;  // name -> file, to check the index
  std::string index_text;
  for (const auto& f : manifest.files) {
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
      STOKER_ASSIGN_OR_RETURN(auto parsed, safetensors::Parse(file->data(), path));
      for (auto& t : parsed.tensors) {
        if (!tensor_file.emplace(t.name, f.name).second)
          return Status::Corruption(fmt::format("tensor '{}' appears in two files of '{}'", t.name, step_directory));
        out.tensors.push_back({std::move(t.name), t.dtype, std::move(t.shape),
                               data.subspan(parsed.data_offset + t.begin, t.end - t.begin)});
      }
    }
    out.mappings.push_back(std::move(file));
  }
  STOKER_RETURN_IF_ERROR(CheckStructure(out.extras.user_json, tensor_file, step_directory));
  if (out.tensors.size() != manifest.tensor_count)
    return Status::Corruption(fmt::format("checkpoint '{}' holds {} tensors; its manifest says {}", step_directory,
                                          out.tensors.size(), manifest.tensor_count));
  if (!index_text.empty()) {
    auto index = nlohmann::json::parse(index_text, nullptr, false);
    const std::string where = step_directory + "/" + std::string(checkpoint::kIndexName);
    if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      return Status::Corruption(fmt::format("'{}' has no weight_map object", where));
    const auto& map = index["weight_map"];
    if (map.size() != tensor_file.size())
      return Status::Corruption(
          fmt::format("'{}' maps {} tensors; the files hold {}", where, map.size(), tensor_file.size()));
    for (const auto& [name, file] : tensor_file) {
      if (!map.contains(name) || !map[name].is_string() || map[name].get<std::string>() != file)
        return Status::Corruption(fmt::format("'{}' does not map tensor '{}' to '{}'", where, name, file));
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
