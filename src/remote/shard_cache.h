// ShardCache: whole shards of a remote dataset in a local folder, fetched
// ahead in the order the loader will read them.
//
// It delegates to small parts, each with its own header and tests:
// CacheFolder (names, the folder's listing, the shared cap's view of other
// processes), DownloadShard (one shard: lock, fetch, check, rename) and the
// eviction policy (eviction.h: the wanted set, Belady with a plan, LRU
// without). This class keeps the entries' states, the plan, the download
// workers and the readers' waits.
//
// Guarantees: a crash never leaves a corrupt entry (entries appear by rename
// once checked); processes sharing the folder download each shard once and
// hold the byte cap together; entries being read are never evicted; a shard
// whose download failed (a whole cycle of attempts, for a reader or for
// read-ahead) fails its readers at once (no new fetch cycle per read) until
// the plan is reset (a new epoch) or `failure_memory_seconds` pass.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/clock.h"
#include "remote/cache_folder.h"
#include "remote/http.h"
#include "stoker/file_system.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker::remote {

struct ShardCacheOptions {
  CacheOptions cache;
  std::uint32_t connections = 8;
  std::uint64_t max_bytes_in_flight = std::uint64_t{512} << 20;
  HttpRequest request;  // template: timeouts and signing; url set per shard
  RetryPolicy retry;
  double failure_memory_seconds = 60;
  Clock* clock = nullptr;  // nullptr: the real clock
};

class ShardCache {
 public:
  // `transport` and `fs` must outlive the cache.
  [[nodiscard]] static Result<std::unique_ptr<ShardCache>> Create(ShardCacheOptions options,
                                                                  std::vector<ShardDesc> shards,
                                                                  HttpTransport* transport, FileSystem* fs);
  ~ShardCache();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  // Reads exactly out.size() bytes of shard `shard` at `offset`, downloading
  // it first if needed. Errors name the shard's URL.
  [[nodiscard]] Status ReadAt(std::uint32_t shard, std::uint64_t offset, std::span<std::byte> out);
  // How the local copies will be read, for the kernel's read-ahead
  // (ReadableFile::AdviseAccess): given to the copies open now and to those
  // opened later.
  void AdviseAccess(AccessPattern pattern);
  // Makes `shard` local (downloading it if needed) without reading it.
  [[nodiscard]] Status Ensure(std::uint32_t shard);

  // The plan: shard visits in read order, appended as the loader schedules
  // them; AdvancePlan says reading has reached a position (as returned by
  // AppendPlan plus an offset); ResetPlan forgets it (new epoch, restore).
  std::uint64_t AppendPlan(std::span<const std::uint32_t> shards);
  void AdvancePlan(std::uint64_t position);
  void ResetPlan();

  [[nodiscard]] RemoteStats stats() const;
  [[nodiscard]] const std::vector<ShardDesc>& shards() const;
  [[nodiscard]] std::string EntryPath(std::uint32_t shard) const;
  [[nodiscard]] bool IsLocal(std::uint32_t shard) const;
  [[nodiscard]] std::uint64_t capacity_bytes() const;
  [[nodiscard]] std::uint64_t largest_shard_bytes() const;

  struct Impl;

 private:
  explicit ShardCache(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::remote
