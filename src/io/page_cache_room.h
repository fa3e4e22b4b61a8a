// How much file data the page cache can hold for this process, so the
// loader can tell whether its shards fit (LoaderOptions::kernel_readahead).
//
// The room is the tightest of:
// - the machine's: MemAvailable in /proc/meminfo (free memory plus the cache
//   the kernel can reclaim: what file data could occupy);
// - each memory cgroup the process is in, itself and every parent: its
//   limit less the anonymous memory charged to it (page cache is charged to
//   the cgroup too, so a container's cache is capped by its limit).
//   cgroup v1: the memory controller's hierarchical_memory_limit and
//   total_rss (memory.stat); cgroup v2: memory.max and memory.stat's anon,
//   for the cgroup and each parent that has them.
// An estimate taken once: what the process and its neighbours allocate
// later shrinks the real room.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "stoker/file_system.h"

namespace stoker::io {

struct PageCacheRoom {
  std::uint64_t bytes = 0;
  // What set it, for messages: "MemAvailable (/proc/meminfo)" or
  // "memory cgroup /jobs/a: limit 1.0 GiB, 300.0 MiB anonymous".
  std::string limited_by;
};

// One memory cgroup level's files, as read (empty when absent).
struct CgroupMemoryFiles {
  std::string path;  // the cgroup, as /proc/self/cgroup names it
  bool v2 = false;   // cgroup v2 (memory.max) or v1 (memory.stat's hierarchical_memory_limit)
  std::string max;   // v2: memory.max ("max" or bytes); unused for v1
  std::string stat;  // memory.stat
};

// Pure: the room from /proc/meminfo's text and the cgroup levels' files.
// nullopt when meminfo has no MemAvailable and no level limits memory.
[[nodiscard]] std::optional<PageCacheRoom> PageCacheRoomFrom(std::string_view meminfo,
                                                             std::span<const CgroupMemoryFiles> levels);

// Reads them from `root` + /proc/meminfo, /proc/self/cgroup and
// /sys/fs/cgroup (root "" is this machine; tests give a folder of fakes).
// nullopt when nothing could be read (not Linux, /proc not mounted).
[[nodiscard]] std::optional<PageCacheRoom> ReadPageCacheRoom(FileSystem& fs, const std::string& root = "");

}  // namespace stoker::io
