// The read-only file system behind a remote dataset: the index is fetched
// into the cache folder (bounded by its own header and the cache's limits)
// and mapped; shard files are read through the ShardCache, which the
// dataset sets up by naming its shards (AttachShards). It is the loader's
// ShardReadPlanner (read-ahead hints) and the cache's control (stats, warm).
#pragma once

#include <map>
#include <memory>
#include <string>

#include "remote/http.h"
#include "remote/shard_cache.h"
#include "stoker/file_system.h"
#include "stoker/remote.h"

namespace stoker::remote {

class RemoteFileSystem final : public FileSystem, public ShardReadPlanner, public ShardCacheControl {
 public:
  // `local` holds the cache folder (FileSystem::Default() in production).
  RemoteFileSystem(RemoteOptions options, std::unique_ptr<HttpTransport> transport, FileSystem* local);
  ~RemoteFileSystem() override;

  // FileSystem. Stat answers for the dataset's shards from the index, and for
  // other objects (the index) by fetching them, bounded; there are no
  // folders. Writes are refused.
  Result<std::unique_ptr<ReadableFile>> OpenForRead(const std::string& path) override;
  using FileSystem::Map;
  Result<std::unique_ptr<MappedFile>> Map(const std::string& path, MapAccess access) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Result<FileInfo> LinkStat(const std::string& path) override { return Stat(path); }
  using FileSystem::CreateForWrite;
  Result<std::unique_ptr<WritableFile>> CreateForWrite(const std::string& path, CreateMode) override;
  Status Rename(const std::string& from, const std::string&) override;
  Status Remove(const std::string& path) override;
  Status RemoveDirectory(const std::string& path) override;
  Status CreateDirectories(const std::string& path) override;
  Status SyncDirectory(const std::string& path) override;
  Result<std::vector<DirEntry>> ListDirectory(const std::string& path) override;
  Result<std::unique_ptr<FileLock>> TryLock(const std::string& path) override;
  Result<std::uint64_t> FreeBytes(const std::string& path) override;
  std::string ReadBatchMethod() override { return "remote cache (pread)"; }
  std::string Sibling(const std::string& path, std::string_view name) const override;
  std::string DisplayName(const std::string& path) const override;
  ShardReadPlanner* read_planner() override { return this; }
  Status AttachShards(std::span<const ShardFile> shards) override;
  Status AttachChunkedFiles(std::span<const ChunkedFileSpec> files, std::uint64_t chunk_bytes) override;
  ShardCacheControl* shard_cache() override { return this; }

  // ShardReadPlanner.
  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards) override;
  void AdvancePlan(std::uint64_t position) override;
  void ResetPlan() override;
  std::uint64_t working_set_bytes() const override;
  std::uint64_t largest_shard_bytes() const override;

  // ShardCacheControl.
  RemoteStats stats() const override;
  Result<WarmReport> Warm(const std::function<void(std::uint64_t, std::uint64_t)>& progress) override;

 private:
  Status CreateCache(std::vector<ShardDesc> descs, const std::string& any_path);
  // Downloads an object that is not a shard (a stoker index, a Megatron
  // .idx, a checkpoint's JSON manifests) into the cache folder, once;
  // returns its local path. Indexes are checked by their magic and bounded
  // by their header's size; anything else by the cache's limits.
  Result<std::string> FetchIndex(const std::string& url);

  RemoteOptions options_;
  FileSystem* local_;
  std::unique_ptr<HttpTransport> transport_;
  std::map<std::string, std::uint32_t> by_path_;  // shard location -> shard number
  struct Chunked {
    std::uint32_t first_chunk = 0;
    std::uint64_t size = 0;
  };
  std::map<std::string, Chunked> chunked_;  // AttachChunkedFiles' files, by location
  std::uint64_t chunk_bytes_ = 0;
  std::map<std::string, std::string> fetched_;  // object URL -> local file
  std::unique_ptr<ShardCache> cache_;           // after transport_: destroyed first
};

// The file system for a remote `location` (http://, https://, s3://), and
// the URL of the dataset's index there.
struct RemoteLocation {
  std::shared_ptr<FileSystem> file_system;
  std::string index_url;
};
[[nodiscard]] Result<RemoteLocation> OpenRemoteLocation(const std::string& location, const RemoteOptions& options);

}  // namespace stoker::remote
