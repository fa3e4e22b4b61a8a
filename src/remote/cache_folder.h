// The cache folder on disk: how entries and partial downloads are named,
// what the folder holds right now (its entries, and the downloads other live
// processes have in flight), and the clean-up of dead processes' leftovers.
//
//   <xxh3(url)>-<checksum>-<name>.shard         a complete, checked shard
//   <entry>.part-<pid>-<n>                      a download in progress by pid
//   <entry>.lock                                flock: one download per shard
//   index-<xxh3(url)>.stoker                    a fetched index
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker::remote {

struct ShardDesc {
  std::string url;
  std::string name;  // for entry names and messages (the index's path)
  std::uint64_t size = 0;
  std::uint64_t checksum = 0;  // xxh3-64 of the whole shard
  // A chunk: the bytes [offset, offset + size) of the object at `url`,
  // fetched by range and checked by size only; `checksum` then names the
  // object's version (entries of another version never match).
  bool chunk = false;
  std::uint64_t offset = 0;
};

class CacheFolder {
 public:
  // Names the entries of `shards` inside `dir` (which must exist).
  CacheFolder(FileSystem* fs, std::string dir, std::span<const ShardDesc> shards);

  [[nodiscard]] const std::string& dir() const { return dir_; }
  [[nodiscard]] const std::string& EntryPath(std::uint32_t shard) const { return entry_paths_[shard]; }
  // A fresh name for a partial download of `shard` by this process.
  [[nodiscard]] std::string NewPartialPath(std::uint32_t shard) const;
  // Removes partial files whose writing process is gone.
  [[nodiscard]] Status RemoveDeadPartials() const;

  struct Listing {
    std::vector<bool> on_disk;  // per shard: its complete entry is there
    // Bytes other live processes are downloading into the folder (their
    // partial files, counted at the shard's full size).
    std::uint64_t others_in_flight = 0;
  };
  // One listing of the folder (its size is the cache's, not the dataset's).
  [[nodiscard]] Result<Listing> List(std::span<const ShardDesc> shards) const;

 private:
  FileSystem* fs_;
  std::string dir_;
  std::vector<std::string> entry_paths_;
  std::unordered_map<std::string, std::uint32_t> shard_of_entry_;  // entry file name -> shard
  mutable std::atomic<std::uint64_t> partial_counter_{0};
};

[[nodiscard]] bool IsCacheEntryName(std::string_view name);
[[nodiscard]] bool IsCachePartialName(std::string_view name);
// $STOKER_CACHE_DIR, else $XDG_CACHE_HOME/stoker, else ~/.cache/stoker.
[[nodiscard]] std::string DefaultCacheDir();
// The process writing a partial file `<entry>.part-<pid>-<n>`; 0 for other names.
[[nodiscard]] long PartialFileWriter(std::string_view name);
[[nodiscard]] bool ProcessAlive(long pid);

}  // namespace stoker::remote
