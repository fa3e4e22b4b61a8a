// One shard into the cache folder: wait for the shard's lock (one download
// per shard across processes), adopt the entry if another process made it
// meanwhile, else fetch it into a partial file (hashed as it arrives),
// check it against the index's size and xxh3 (once more on a mismatch, then
// give up), fsync and rename it into place.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "core/clock.h"
#include "remote/cache_folder.h"
#include "remote/http.h"
#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker::remote {

struct DownloadCounts {
  std::uint32_t retries = 0;
  std::uint32_t connections = 0;
  bool adopted = false;  // another process had downloaded it
};

struct DownloadContext {
  FileSystem* fs = nullptr;
  const CacheFolder* folder = nullptr;
  HttpTransport* transport = nullptr;
  const HttpRequest* request_template = nullptr;  // url set per shard
  const RetryPolicy* retry = nullptr;
  Clock* clock = nullptr;
  // Set when the cache closes: waiting for the lock and the transfer stop.
  const std::atomic<bool>* stopping = nullptr;
  // Makes room on the file system for `bytes` more (evicting entries), or
  // says why it cannot; called with the shard's lock held, before writing.
  std::function<Status(std::uint64_t bytes)> ensure_free_space;
};

// The entry for `shard` (opened for reading), downloaded or adopted.
[[nodiscard]] Result<std::unique_ptr<ReadableFile>> DownloadShard(const DownloadContext& context, std::uint32_t shard,
                                                                  const ShardDesc& desc, DownloadCounts* counts);

}  // namespace stoker::remote
