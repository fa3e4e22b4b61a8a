// The epoch order a Loader uses, resolved against where the data lives.
// Local data: Order::kAuto is a global shuffle. A remote dataset read
// through a cache smaller than the data: kAuto is the shard-aware shuffle
// (kShardBlockShuffle). Its working set is what the batches in flight read
// at once (the shards touched by any run of `in flight x global batch`
// positions of the epoch's order: a window's shards, two windows' where
// they meet, more when a batch spans several shards) plus the next shard:
// the window is the largest whose working set and the next window fit the
// cache; batches in flight (prefetch) are lowered until the working set
// fits; a cache that cannot hold it even then is refused, naming the sizes
// and the smallest cache that works. The bytes an epoch will download are
// predicted by replaying the cache's eviction over the epoch's shard visits
// (order/cache_model.h), so a global shuffle that would download the
// dataset many times over is said before it starts.
#pragma once

#include <cstdint>
#include <string>

#include "order/sampler.h"
#include "stoker/dataset.h"
#include "stoker/file_system.h"
#include "stoker/loader.h"

namespace stoker::pipeline {

struct OrderChoice {
  order::OrderSpec spec;
  Order order = Order::kShuffle;  // resolved: never kAuto
  // Remote datasets with a cache: what epoch 0 is predicted to download,
  // and what was chosen and why; `warning` when that is over 1.5x the
  // dataset. Zero and empty for local data.
  std::uint64_t predicted_epoch_download_bytes = 0;
  std::string note;
  bool warning = false;
  // The most batches prefetched whose reads fit the cache with the next
  // shard (kMaxPrefetch when anything goes: local data, a global shuffle).
  std::uint32_t max_prefetch = kMaxPrefetch;
};

// `planner`: the dataset's remote cache, or nullptr for local data.
// `prefetch`: the batches the loader would prefetch (the consumer may hold
// two more). InvalidArgument when the cache cannot hold the order's working
// set with one batch prefetched.
[[nodiscard]] Result<OrderChoice> ChooseOrder(const LoaderOptions& options, const order::BatchPlan& plan,
                                              const Dataset& dataset, const ShardReadPlanner* planner,
                                              std::uint32_t prefetch);

// The most shards touched by any `span` consecutive positions of `order`
// (each position a sample; `shard_of_sample` maps it to its shard).
[[nodiscard]] std::uint32_t ShardsTouchedAtOnce(const order::Permutation& order,
                                                const std::vector<std::uint32_t>& shard_of_sample, std::uint64_t span);

[[nodiscard]] std::string_view OrderName(Order order);
// The sampler's mode for a resolved order (kAuto reads as kShuffle).
[[nodiscard]] order::OrderMode ModeOf(Order order);

}  // namespace stoker::pipeline
