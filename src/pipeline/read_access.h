// How the loader asks the kernel to read shard files, local or a remote
// cache's copies (LoaderOptions::kernel_readahead).
//
// A global shuffle reads each sample at a random place in a random shard.
// When the shards fit in the page cache, the kernel's read-ahead is harmless
// (the first epoch even gains: what it reads ahead is used later). When they
// do not, what it reads ahead is evicted before any batch asks for it, and
// the disk serves bytes nobody uses: README "Shards larger than the page
// cache" measured 1.70x the images/s and 37% fewer bytes from storage
// without it (a 380 MiB cgroup, 8 MiB device read-ahead). kAuto therefore
// switches read-ahead off (POSIX_FADV_RANDOM) exactly for a global shuffle
// over shards larger than the page cache's room (io/page_cache_room.h);
// orders that read shard by shard keep it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/page_cache_room.h"
#include "stoker/file_system.h"
#include "stoker/loader.h"

namespace stoker::pipeline {

struct ReadAccessChoice {
  AccessPattern pattern = AccessPattern::kNormal;
  // Why, in words (LoaderStats::readahead_note); empty when there was
  // nothing to decide (remote shards, loose files).
  std::string note;
};

// `order`: the resolved order. `shard_files`: packed shards, read as local
// files or as a remote cache's local copies (not loose files, read whole).
// `shard_bytes`: their sum.
// `room`: what the page cache can hold now, nullopt when unknown (then
// kAuto keeps read-ahead). `loader_bytes`: what the loader will allocate
// after the room was measured (its batch buffers), taken off the room.
[[nodiscard]] ReadAccessChoice ChooseReadAccess(KernelReadahead option, Order order, bool shard_files,
                                                std::uint64_t shard_bytes, const std::optional<io::PageCacheRoom>& room,
                                                std::uint64_t loader_bytes);

}  // namespace stoker::pipeline
