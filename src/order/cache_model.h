// What a shard cache of a given size downloads for a sequence of shard
// visits, replayed without files, threads or a network: the remote cache's
// own policy (evict the shard needed furthest ahead, Belady's rule) over an
// epoch's visits, from an empty cache. Lets the loader predict, at open, the
// download volume of an order before any byte moves.
#pragma once

#include <cstdint>
#include <span>

namespace stoker::order {

// Bytes downloaded serving `visits` (shard indices in read order) with a
// cache of `capacity` bytes; a shard larger than the cache is downloaded at
// every visit.
[[nodiscard]] std::uint64_t ReplayDownloads(std::span<const std::uint32_t> visits,
                                            std::span<const std::uint64_t> shard_bytes, std::uint64_t capacity);

}  // namespace stoker::order
