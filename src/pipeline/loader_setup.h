// What a Loader's options resolve to, validated before anything is
// allocated: the rank's batch plan (ranks from the options or torchrun's
// RANK / WORLD_SIZE), thread and prefetch counts, and the epoch order
// (order_choice.h: kAuto resolved, the shard window sized for a remote
// cache, a cache too small for the order refused).
#pragma once

#include <cstdint>

#include "order/sampler.h"
#include "pipeline/loader_counters.h"
#include "pipeline/order_choice.h"
#include "stoker/dataset.h"
#include "stoker/loader.h"

namespace stoker::pipeline {

struct LoaderSetup {
  order::BatchPlan plan;
  OrderChoice order;  // what Order::kAuto became, the prediction and the note
  order::OrderSpec order_spec;
  std::uint32_t threads = 0;   // active at the start
  std::uint32_t prefetch = 0;  // at the start
  // Autotune: the most threads it may use (all are started; those beyond
  // the active count wait), and its memory budget for batch buffers.
  std::uint32_t max_threads = 0;
  std::uint64_t autotune_memory_bytes = 0;
  // Samples each batch buffer holds: batch_size, or with a global batch the
  // largest share any allowed world size gives a rank.
  std::uint32_t rank_capacity = 0;
};

// Batch buffers for `prefetch` (at least 1) batches in flight: one more
// for the batch the consumer uses, and a reserve (BatchScheduler's last
// slot) for a consumer that keeps two or more (one in use and one being
// copied, threads sharing a loader). The reserve is withheld right after
// Next() hands over batch k + 1, while a loop holding one batch still holds
// k: the next batch waits for k's release (Loader::Release, microseconds
// later), so such a loop never touches the reserve's pages (a pinned pool
// never allocates it).
[[nodiscard]] constexpr std::uint32_t BatchPoolSize(std::uint32_t prefetch) {
  return prefetch + 2;
}
// An automatic prefetch depth decodes ahead only into batch buffers the
// loop has touched (pipeline/buffer_warmth.h) when a batch holds at least
// this many samples per thread.
inline constexpr std::uint32_t kWarmBuffersSamplesPerThread = 16;

// InvalidArgument naming the option for anything out of range: batch size,
// threads, prefetch, ranks, the transform's sizes, scale, ratio, flip
// probability and normalisation (finite means, positive finite stds).
[[nodiscard]] Result<LoaderSetup> ResolveLoaderSetup(const Dataset& dataset, const LoaderOptions& options);
[[nodiscard]] Status ValidateTransform(const TransformOptions& transform);

// The counters as LoaderStats (the configuration fields are the caller's).
[[nodiscard]] LoaderStats StatsFromCounters(const LoaderCounters& counters);

}  // namespace stoker::pipeline
