// Which shards a cache should hold, and which to evict: pure functions of
// the read plan (shard visits in order), the shard sizes and the entries'
// states, so that the policy is tested without files, threads or a network.
//
// With a plan, the wanted set is the shards needed soonest that fill the
// cache; read-ahead fetches those and displaces only entries outside it,
// and a reader's miss evicts the entry needed furthest ahead (Belady's
// rule). Without a plan every shard is "beyond" and eviction is LRU.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace stoker::remote {

inline constexpr std::uint64_t kBeyond = UINT64_MAX;  // not needed within the plan's horizon

struct Horizon {
  std::vector<std::uint64_t> next_use;  // per shard: plan position of its next visit, or kBeyond
  std::vector<std::uint32_t> order;     // shards by next use
  // The first `wanted` of `order` fill the cache: what it should hold.
  std::size_t wanted = 0;
  std::uint64_t last_wanted_use = 0;  // the next use of the last of them
};

// The horizon of `plan` (visits at global positions plan_base, plan_base+1,
// ...) seen from `position`: next uses over a lookahead of twice `capacity`
// bytes of distinct shards, and the wanted set (at least one shard).
[[nodiscard]] Horizon ComputeHorizon(std::span<const std::uint32_t> plan, std::uint64_t plan_base,
                                     std::uint64_t position, std::span<const std::uint64_t> shard_sizes,
                                     std::uint64_t capacity);

// A cache entry as the policy sees it.
struct EntryState {
  bool present = false;    // complete on disk
  bool evictable = false;  // present, not being read, no reader waiting for it
  std::uint64_t last_use = 0;
};

// The evictable entry needed furthest ahead among those needed later than
// `after` (ties, and entries beyond the horizon: least recently used), or
// nullopt when none may go.
[[nodiscard]] std::optional<std::uint32_t> ChooseVictim(std::span<const EntryState> entries, const Horizon& horizon,
                                                        std::uint64_t after);

}  // namespace stoker::remote
