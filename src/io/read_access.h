// How a reader asks the kernel to read its files: the image loader its
// shard files, local or a remote cache's copies
// (LoaderOptions::kernel_readahead); the token loader its mapped .bin files
// (TokenLoaderOptions::kernel_readahead).
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
#include <string_view>

#include "io/page_cache_room.h"
#include "stoker/file_system.h"

namespace stoker::io {

struct ReadAccessChoice {
  AccessPattern pattern = AccessPattern::kNormal;
  // Why, in words (LoaderStats::readahead_note); empty when there was
  // nothing to decide (remote shards, loose files).
  std::string note;
};

// `random_reads`: the order reads at random places (a global shuffle);
// otherwise `ordered_reason` says how it reads (for the note). `applies`:
// the files can take the advice (not loose files, read whole). `what`:
// the files, for the note ("shards", "token files"), and `bytes` their
// sum. `room`: what the page cache can hold now, nullopt when unknown (then
// kAuto keeps read-ahead). `reader_bytes`: what the reader will allocate
// after the room was measured (its batch buffers), taken off the room.
[[nodiscard]] ReadAccessChoice ChooseReadAccess(KernelReadahead option, bool random_reads,
                                                std::string_view ordered_reason, bool applies, std::string_view what,
                                                std::uint64_t bytes, const std::optional<PageCacheRoom>& room,
                                                std::uint64_t reader_bytes);

}  // namespace stoker::io
