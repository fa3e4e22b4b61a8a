#include "pipeline/loader_setup.h"
#include "transform/augmentation.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

namespace stoker::pipeline {
namespace {

// torchrun's RANK / WORLD_SIZE; nullopt when unset, an error when malformed.
Result<std::optional<int>> EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::optional<int>();
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (end == nullptr || *end != '\0' || errno != 0 || x < 0 || x > 1'000'000)
    return Status::InvalidArgument(fmt::format("${}='{}' is not a non-negative integer", name, v));
  return std::optional<int>(static_cast<int>(x));
}

}  // namespace

Status ValidateTransform(const TransformOptions& t) {
  if (t.width <= 0 || t.height <= 0 || t.width > 16384 || t.height > 16384)
    return Status::InvalidArgument(fmt::format("output size {}x{} is out of range (1..16384)", t.width, t.height));
  if (!(t.scale[0] > 0 && t.scale[0] <= t.scale[1] && t.scale[1] <= 1))
    return Status::InvalidArgument(
        fmt::format("scale ({}, {}) must satisfy 0 < lo <= hi <= 1", t.scale[0], t.scale[1]));
  if (!(t.ratio[0] > 0 && t.ratio[0] <= t.ratio[1] && std::isfinite(t.ratio[1])))
    return Status::InvalidArgument(
        fmt::format("ratio ({}, {}) must satisfy 0 < lo <= hi (finite)", t.ratio[0], t.ratio[1]));
  if (!(t.flip_probability >= 0 && t.flip_probability <= 1))
    return Status::InvalidArgument(fmt::format("flip probability {} is not in [0, 1]", t.flip_probability));
  if (t.kind == TransformOptions::Kind::kResizeCenterCrop &&
      (t.resize < std::max(t.width, t.height) || t.resize > 65536))
    return Status::InvalidArgument(
        fmt::format("resize {} must be at least the crop {}x{} (and at most 65536)", t.resize, t.width, t.height));
  STOKER_RETURN_IF_ERROR(transform::Augmentation::Create(t).status());
  if (t.normalize) {
    for (int c = 0; c < 3; ++c) {
      if (!std::isfinite(t.mean[c]))
        return Status::InvalidArgument(fmt::format("normalize mean[{}] = {} is not a finite number", c, t.mean[c]));
      if (!(t.std[c] > 0) || !std::isfinite(t.std[c]))
        return Status::InvalidArgument(
            fmt::format("normalize std[{}] = {} must be a positive finite number", c, t.std[c]));
    }
  }
  return Status::Ok();
}

Result<LoaderSetup> ResolveLoaderSetup(const Dataset& dataset, const LoaderOptions& options) {
  if (options.batch_size == 0 || options.batch_size > kMaxBatchSize)
    return Status::InvalidArgument(
        fmt::format("batch_size {} must be between 1 and {}", options.batch_size, kMaxBatchSize));
  if (options.threads > kMaxLoaderThreads)
    return Status::InvalidArgument(
        fmt::format("threads {} is more than the limit {} (0 picks one per core)", options.threads, kMaxLoaderThreads));
  if (options.prefetch > kMaxPrefetch)
    return Status::InvalidArgument(fmt::format("prefetch {} is more than the limit {} (0 picks it automatically)",
                                               options.prefetch, kMaxPrefetch));
  STOKER_RETURN_IF_ERROR(ValidateTransform(options.transform));

  // Ranks: explicit, else torchrun's RANK and WORLD_SIZE, else 0 of 1.
  STOKER_ASSIGN_OR_RETURN(auto env_world, EnvInt("WORLD_SIZE"));
  STOKER_ASSIGN_OR_RETURN(auto env_rank, EnvInt("RANK"));
  if (options.world_size < -1 || options.world_size == 0)
    return Status::InvalidArgument(
        fmt::format("world_size {} must be positive (or -1: from $WORLD_SIZE)", options.world_size));
  if (options.rank < -1)
    return Status::InvalidArgument(fmt::format("rank {} must be non-negative (or -1: from $RANK)", options.rank));
  const int world = options.world_size > 0 ? options.world_size : env_world.value_or(1);
  const int rank = options.rank >= 0 ? options.rank : env_rank.value_or(0);
  if (world <= 0) return Status::InvalidArgument(fmt::format("world size {} must be positive ($WORLD_SIZE)", world));
  if (rank >= world)
    return Status::InvalidArgument(fmt::format("rank {} is out of range for world size {}", rank, world));
  if (dataset.num_samples() == 0)
    return Status::InvalidArgument(fmt::format("dataset '{}' is empty", dataset.index_path()));
  // A missing or rewritten shard fails here, not when an epoch reaches it; with on_corrupt skip, a shard of
  // another size is left to the reads, whose samples past its end are skipped and counted.
  STOKER_RETURN_IF_ERROR(dataset.CheckShardFiles(/*sizes=*/options.on_corrupt == CorruptPolicy::kError));

  order::BatchPlan plan;
  plan.num_samples = dataset.num_samples();
  plan.world_size = static_cast<std::uint32_t>(world);
  plan.rank = static_cast<std::uint32_t>(rank);
  plan.global_batch = std::uint64_t{options.batch_size} * plan.world_size;
  plan.drop_last = options.drop_last;
  std::uint32_t rank_capacity = options.batch_size;
  if (options.global_batch_size > 0) {
    const std::uint32_t min_world = options.min_world_size ? options.min_world_size : plan.world_size;
    if (plan.world_size < min_world)
      return Status::InvalidArgument(
          fmt::format("world size {} is below min_world_size {}", plan.world_size, min_world));
    plan.global_batch = options.global_batch_size;
    plan.balanced = true;
    const std::uint64_t capacity = (plan.global_batch + min_world - 1) / min_world;
    if (capacity > kMaxBatchSize)
      return Status::InvalidArgument(
          fmt::format("global_batch_size {} over min_world_size {} gives {} samples per rank, more than the limit {}",
                      options.global_batch_size, min_world, capacity, kMaxBatchSize));
    rank_capacity = static_cast<std::uint32_t>(capacity);
  } else if (options.min_world_size != 0) {
    return Status::InvalidArgument("min_world_size needs global_batch_size (elastic training)");
  }
  STOKER_RETURN_IF_ERROR(plan.Validate());

  const std::uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  LoaderSetup setup;
  if (options.autotune) {
    if (options.autotune_max_threads > kMaxLoaderThreads)
      return Status::InvalidArgument(fmt::format("autotune_max_threads {} is more than the limit {}",
                                                 options.autotune_max_threads, kMaxLoaderThreads));
    // Leave the training thread a core of its own.
    setup.max_threads = options.autotune_max_threads ? options.autotune_max_threads : std::max(1u, cores - 1);
    setup.threads = std::min(options.threads ? options.threads : 1u, setup.max_threads);
    setup.prefetch = options.prefetch ? options.prefetch : 2;
    setup.autotune_memory_bytes = options.autotune_memory_bytes;
    if (setup.autotune_memory_bytes == 0) {
      const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
      setup.autotune_memory_bytes =
          pages > 0 && page > 0 ? static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page) / 8 : 1ull << 30;
    }
  } else {
    setup.threads = options.threads ? options.threads : cores;
    setup.prefetch = options.prefetch ? options.prefetch : std::clamp(setup.threads / 4 + 1, 2u, 4u);
    setup.max_threads = setup.threads;
  }
  setup.plan = plan;
  setup.rank_capacity = rank_capacity;
  ShardReadPlanner* planner = dataset.file_system() ? dataset.file_system()->read_planner() : nullptr;
  STOKER_ASSIGN_OR_RETURN(setup.order, ChooseOrder(options, plan, dataset, planner, setup.prefetch));
  setup.prefetch = std::min(setup.prefetch, setup.order.max_prefetch);
  setup.order_spec = setup.order.spec;
  return setup;
}

LoaderStats StatsFromCounters(const LoaderCounters& c) {
  LoaderStats s;
  s.batches = c.batches.load();
  s.samples = c.samples.load();
  s.bytes_read = c.bytes.load();
  s.samples_read = c.samples_read.load();
  s.corrupt_skipped = c.corrupt_skipped.load();
  s.wait_seconds = static_cast<double>(c.wait_ns.load()) * 1e-9;
  s.read_seconds = static_cast<double>(c.read_ns.load()) * 1e-9;
  s.decode_seconds = static_cast<double>(c.decode_ns.load()) * 1e-9;
  s.transform_seconds = static_cast<double>(c.transform_ns.load()) * 1e-9;
  const auto calls = c.next_calls.load();
  s.mean_ready_batches = calls ? static_cast<double>(c.ready_sum.load()) / static_cast<double>(calls) : 0;
  s.read_requests = c.read_requests.load();
  s.seekable_decodes = c.seekable_decodes.load();
  s.seekable_fallbacks = c.seekable_fallbacks.load();
  s.seekable_part_reads = c.seekable_part_reads.load();
  s.seekable_part_rereads = c.seekable_part_rereads.load();
  return s;
}

}  // namespace stoker::pipeline
