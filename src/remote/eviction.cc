#include "remote/eviction.h"

namespace stoker::remote {

Horizon ComputeHorizon(std::span<const std::uint32_t> plan, std::uint64_t plan_base, std::uint64_t position,
                       std::span<const std::uint64_t> shard_sizes, std::uint64_t capacity) {
  Horizon h;
  h.next_use.assign(shard_sizes.size(), kBeyond);
  std::uint64_t bytes = 0;
  for (std::uint64_t i = position > plan_base ? position - plan_base : 0; i < plan.size(); ++i) {
    const std::uint32_t s = plan[i];
    if (s >= shard_sizes.size() || h.next_use[s] != kBeyond) continue;
    bytes += shard_sizes[s];
    if (bytes > 2 * capacity && !h.order.empty()) break;
    h.next_use[s] = plan_base + i;
    h.order.push_back(s);
    if (bytes <= capacity || h.wanted == 0) {
      h.wanted = h.order.size();
      h.last_wanted_use = plan_base + i;
    }
  }
  return h;
}

std::optional<std::uint32_t> ChooseVictim(std::span<const EntryState> entries, const Horizon& horizon,
                                          std::uint64_t after) {
  std::optional<std::uint32_t> best;
  for (std::uint32_t s = 0; s < entries.size(); ++s) {
    const EntryState& e = entries[s];
    if (!e.present || !e.evictable) continue;
    const std::uint64_t use = s < horizon.next_use.size() ? horizon.next_use[s] : kBeyond;
    if (use <= after && use != kBeyond) continue;
    if (!best) {
      best = s;
      continue;
    }
    const std::uint64_t best_use = *best < horizon.next_use.size() ? horizon.next_use[*best] : kBeyond;
    if (use > best_use || (use == best_use && e.last_use < entries[*best].last_use)) best = s;
  }
  return best;
}

}  // namespace stoker::remote
