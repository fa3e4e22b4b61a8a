// ShardCache: whole shards of a remote dataset in a local folder, fetched
// ahead in the order the loader will read them.
//
// Entries are named after the shard's URL and checksum, written to a
// temporary name, checked against the index (size and xxh3), fsynced and
// renamed: a crash never leaves a corrupt entry. A per-entry flock makes the
// processes sharing the folder download each shard once; the kernel drops
// the lock when a process dies, so no lock is ever stale. Before evicting, a
// cache looks at which entries the folder really holds and which downloads
// other live processes have in flight, so that the byte cap holds for the
// processes together.
//
// Read-ahead walks the announced plan (shard visits in order) from the
// current position and downloads the shards needed soonest, with up to
// `connections` transfers and `max_bytes_in_flight` bytes at once. The
// wanted set is the shards needed soonest that fill the cache; read-ahead
// fetches those and only displaces entries outside it (not needed at all
// first, least recently used first, then the one needed furthest ahead); a
// reader's miss evicts the entry needed furthest ahead (Belady).
// Without a plan, eviction is LRU. Entries being read are never evicted.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "remote/http.h"
#include "stoker/file_system.h"
#include "stoker/remote.h"
#include "stoker/status.h"

namespace stoker::remote {

struct ShardDesc {
  std::string url;
  std::string name;  // for entry names and messages (the index's path)
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxh3-64 of the whole shard
};

struct ShardCacheOptions {
  CacheOptions cache;
  std::uint32_t connections = 8;
  std::uint64_t max_bytes_in_flight = std::uint64_t{512} << 20;
  HttpRequest request;  // template: timeouts and signing; url set per shard
  RetryPolicy retry;
  // Free bytes on the cache's file system (tests substitute); default statvfs.
  std::function<Result<std::uint64_t>(const std::string& dir)> free_bytes;
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

// Entry and temporary-file naming, shared with `stoker cache stat|clear`.
[[nodiscard]] bool IsCacheEntryName(std::string_view name);
[[nodiscard]] bool IsCachePartialName(std::string_view name);
[[nodiscard]] std::string DefaultCacheDir();

}  // namespace stoker::remote
