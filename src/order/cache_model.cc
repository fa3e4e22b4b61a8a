#include "order/cache_model.h"

#include <limits>
#include <set>
#include <utility>
#include <vector>

namespace stoker::order {

std::uint64_t ReplayDownloads(std::span<const std::uint32_t> visits, std::span<const std::uint64_t> shard_bytes,
                              std::uint64_t capacity) {
  constexpr std::uint64_t kNever = std::numeric_limits<std::uint64_t>::max();
  // next[i]: the visit after i of the same shard.
  std::vector<std::uint64_t> next(visits.size(), kNever);
  std::vector<std::uint64_t> seen(shard_bytes.size(), kNever);
  for (std::size_t i = visits.size(); i-- > 0;) {
    const std::uint32_t s = visits[i];
    if (s >= shard_bytes.size()) continue;
    next[i] = seen[s];
    seen[s] = i;
  }
  std::set<std::pair<std::uint64_t, std::uint32_t>> cached;  // (next use, shard)
  std::vector<std::uint64_t> key(shard_bytes.size(), kNever);
  std::vector<bool> present(shard_bytes.size(), false);
  std::uint64_t used = 0, downloaded = 0;
  for (std::size_t i = 0; i < visits.size(); ++i) {
    const std::uint32_t s = visits[i];
    if (s >= shard_bytes.size()) continue;
    if (present[s]) {
      cached.erase({key[s], s});
    } else {
      downloaded += shard_bytes[s];
      if (shard_bytes[s] > capacity) continue;  // read through, never kept
      while (used + shard_bytes[s] > capacity) {
        const auto furthest = std::prev(cached.end());
        present[furthest->second] = false;
        used -= shard_bytes[furthest->second];
        cached.erase(furthest);
      }
      present[s] = true;
      used += shard_bytes[s];
    }
    key[s] = next[i];
    cached.insert({key[s], s});
  }
  return downloaded;
}

}  // namespace stoker::order
