// OpenShardedCheckpointAt: a sharded checkpoint on local disk or behind a
// URL. Remote: the manifests are fetched whole (small), the data files are
// attached to the remote file system's shard cache as chunked files of one
// checksum block per chunk (versioned by the file's xxh3), so that reading
// a region fetches, by range, just the blocks it touches.
#include <fmt/format.h>

#include "checkpoint/manifest.h"
#include "checkpoint/sharded_manifest.h"
#include "remote/remote_file_system.h"
#include "stoker/sharded_checkpoint.h"

namespace stoker {

Result<std::unique_ptr<ShardedCheckpoint>> OpenShardedCheckpointAt(const std::string& location, const LoadOptions& load,
                                                                   const RemoteOptions& remote_options) {
  if (!IsRemoteLocation(location)) return ShardedCheckpoint::Open(location, load);
  STOKER_ASSIGN_OR_RETURN(remote::RemoteLocation opened, remote::OpenRemoteLocation(location, remote_options));
  std::shared_ptr<FileSystem> fs = opened.file_system;
  std::string step_url = location;
  while (step_url.ends_with('/')) step_url.pop_back();
  if (!checkpoint::ParseStepDirectoryName(step_url.substr(step_url.rfind('/') + 1))) {
    // A checkpoint directory: `latest` names its newest step (there is no listing over HTTP).
    const std::string latest_url = step_url + "/" + std::string(checkpoint::kLatestName);
    auto latest = ReadWholeFile(*fs, latest_url);
    if (!latest.ok()) return latest.error().WithContext(fmt::format("reading '{}'", fs->DisplayName(latest_url)));
    std::string name(reinterpret_cast<const char*>(latest->data()), latest->size());
    while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
    if (!checkpoint::ParseStepDirectoryName(name))
      return Status::Corruption(fmt::format("'{}' says '{}', not a step-N folder", fs->DisplayName(latest_url), name));
    step_url += "/" + name;
  }
  STOKER_ASSIGN_OR_RETURN(checkpoint::Manifest manifest, checkpoint::ReadManifest(*fs, step_url));
  if (manifest.sharded_json.empty())
    return Status::FailedPrecondition(
        fmt::format("'{}' is a checkpoint of one process, not a sharded one", fs->DisplayName(step_url)));
  STOKER_ASSIGN_OR_RETURN(
      checkpoint::ShardedLayout layout,
      checkpoint::DecodeShardedLayout(manifest.sharded_json, step_url + "/" + std::string(checkpoint::kManifestName)));
  std::vector<FileSystem::ChunkedFileSpec> data_files;
  for (const auto& f : manifest.files)
    if (layout.blocks.contains(f.name)) data_files.push_back({step_url + "/" + f.name, f.bytes, f.xxh3});
  STOKER_RETURN_IF_ERROR(fs->AttachChunkedFiles(data_files, layout.block_bytes));
  LoadOptions options = load;
  options.file_system = fs.get();
  return ShardedCheckpoint::Open(step_url, options, fs);
}

}  // namespace stoker
