// Remote datasets: shards and index behind http://, https:// or s3:// URLs,
// read through a local cache of whole shards that fetches ahead in the order
// the loader will read them and evicts the shards needed furthest ahead.
//
//   RemoteOptions options;
//   options.cache.dir = "/local/nvme/stoker-cache";
//   options.cache.capacity_bytes = 200ull << 30;
//   OpenOptions open;  // open.h
//   open.remote.cache.dir = ...;
//   auto dataset = OpenDataset("s3://bucket/imagenet/train", open);
//
// s3:// URLs are signed with AWS Signature V4 (libcurl's CURLOPT_AWS_SIGV4)
// from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; the
// region from AWS_REGION or AWS_DEFAULT_REGION (default us-east-1); the
// endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (default
// https://s3.REGION.amazonaws.com), addressed path-style.
//
// Guarantees: every downloaded shard is checked against the index's size and
// xxh3 checksum before use; a cache entry appears by rename only when
// complete, so a crash never leaves a corrupt one; processes sharing a cache
// folder download each shard once (flock, released by the kernel on death).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "stoker/dataset.h"
#include "stoker/status.h"

namespace stoker {

struct CacheOptions {
  // The cache folder (created if missing). Empty: $STOKER_CACHE_DIR, else
  // $XDG_CACHE_HOME/stoker, else ~/.cache/stoker.
  std::string dir;
  // Shards kept at most (bytes). A shard being read is never evicted, so a
  // working set larger than this overshoots it (counted in stats).
  std::uint64_t capacity_bytes = std::uint64_t{16} << 30;
  // Downloads stop (and evict first) when the file system would be left with
  // less free space than this.
  std::uint64_t min_free_bytes = std::uint64_t{1} << 30;
};

struct RemoteOptions {
  CacheOptions cache;
  // Shards downloaded at once (each its own connection).
  std::uint32_t connections = 8;
  // Read-ahead stops while this many bytes are downloading.
  std::uint64_t max_bytes_in_flight = std::uint64_t{512} << 20;
  // Per request: seconds to connect, and seconds below 1 KiB/s before a
  // transfer counts as stalled.
  double connect_timeout_seconds = 10;
  double stall_timeout_seconds = 30;
  // Attempts per object (timeouts, resets, truncation, 5xx, 429) with
  // exponential backoff and full jitter between them, honouring Retry-After.
  std::uint32_t max_attempts = 8;
  double backoff_initial_seconds = 0.1;
  double backoff_max_seconds = 10;
  // One object's download, every attempt and wait included, at most this
  // long; then it fails, and a shard that failed fails its readers at once
  // for the rest of the epoch (no new fetch cycle per read).
  double fetch_deadline_seconds = 300;
};

// True for http://, https:// and s3:// locations, and for any scheme
// registered with RegisterFileSystem (open.h).
[[nodiscard]] bool IsRemoteLocation(std::string_view location);

// What a cache folder holds.
struct CacheStat {
  std::string dir;
  std::uint64_t entries = 0;  // complete shards
  std::uint64_t bytes = 0;
  std::uint64_t partial_files = 0;  // downloads in progress or left by a crash
  std::uint64_t partial_bytes = 0;
  std::uint64_t free_bytes = 0;  // on its file system
};
[[nodiscard]] Result<CacheStat> StatCache(const CacheOptions& options);
// Removes every entry and leftover that no process is downloading.
[[nodiscard]] Result<CacheStat> ClearCache(const CacheOptions& options);

// Remote read-ahead figures (all zero for a local dataset).
struct RemoteStats {
  std::uint64_t hits = 0;       // shard reads served from the cache
  std::uint64_t misses = 0;     // reads that waited for a download
  std::uint64_t downloads = 0;  // shards downloaded
  std::uint64_t bytes_downloaded = 0;
  std::uint64_t evictions = 0;
  std::uint64_t retries = 0;        // requests repeated after a fault
  std::uint64_t connections = 0;    // connections opened (HTTP/2 multiplexes many downloads on one)
  std::uint64_t adopted = 0;        // shards another process had downloaded
  std::uint64_t over_capacity = 0;  // downloads that had to exceed the cap
  double wait_seconds = 0;          // readers blocked on downloads
};
[[nodiscard]] RemoteStats GetRemoteStats(const Dataset& dataset);

// What WarmCache did.
struct WarmReport {
  std::uint64_t shards = 0;       // of the dataset
  std::uint64_t cached = 0;       // local now
  std::uint64_t bytes = 0;        // of those
  std::uint64_t not_fitting = 0;  // shards left out: the cache is too small for them
};
// Downloads every shard of `dataset` that fits (in dataset order), for
// `stoker cache warm`; progress(done, total shards) may be empty.
// InvalidArgument when the dataset is not remote.
[[nodiscard]] Result<WarmReport> WarmCache(const Dataset& dataset,
                                           const std::function<void(std::uint64_t, std::uint64_t)>& progress);

}  // namespace stoker
