#include "order/sampler.h"

#include <numeric>

#include <fmt/format.h>

#include "core/rng.h"

namespace stoker::order {

std::vector<std::uint64_t> EpochOrder(const OrderSpec& spec, std::uint64_t epoch,
                                      const std::vector<ShardSpan>& shards) {
  std::uint64_t n = 0;
  for (const auto& s : shards) n += s.num_samples;
  std::vector<std::uint64_t> order(n);
  std::iota(order.begin(), order.end(), std::uint64_t{0});
  Rng rng(spec.seed, epoch);
  switch (spec.mode) {
    case OrderMode::kSequential:
      break;
    case OrderMode::kShuffle:
      Shuffle(order.data(), n, rng);
      break;
    case OrderMode::kShardBlockShuffle: {
      std::vector<std::uint64_t> shard_order(shards.size());
      std::iota(shard_order.begin(), shard_order.end(), std::uint64_t{0});
      Shuffle(shard_order.data(), shard_order.size(), rng);
      const std::uint64_t window = std::max<std::uint32_t>(1, spec.shard_window);
      std::uint64_t out = 0;
      for (std::uint64_t w = 0; w < shard_order.size(); w += window) {
        const std::uint64_t begin = out;
        for (std::uint64_t k = w; k < std::min<std::uint64_t>(w + window, shard_order.size()); ++k) {
          const auto& s = shards[shard_order[k]];
          for (std::uint64_t i = 0; i < s.num_samples; ++i) order[out++] = s.first_sample + i;
        }
        Shuffle(order.data() + begin, out - begin, rng);
      }
      break;
    }
  }
  return order;
}

Status BatchPlan::Validate() const {
  if (global_batch == 0) return Status::InvalidArgument("batch size must be positive");
  if (world_size == 0) return Status::InvalidArgument("world size must be positive");
  if (rank >= world_size)
    return Status::InvalidArgument(fmt::format("rank {} is out of range for world size {}", rank, world_size));
  if (!balanced && global_batch % world_size != 0)
    return Status::InvalidArgument(
        fmt::format("global batch {} is not a multiple of the world size {}", global_batch, world_size));
  return Status::Ok();
}

std::uint64_t BatchPlan::NumBatches() const {
  if (drop_last) return num_samples / global_batch;
  return (num_samples + global_batch - 1) / global_batch;
}

std::uint64_t BatchPlan::MaxRankBatch() const {
  return (global_batch + world_size - 1) / world_size;
}

std::uint64_t BatchPlan::RankSamplesPerEpoch() const {
  const std::uint64_t full = num_samples / global_batch, rest = drop_last ? 0 : num_samples % global_batch;
  if (!balanced) return full * (global_batch / world_size) + (rest + world_size - 1) / world_size;
  // The rank's share of a global batch of `size`, as RankPositions takes it.
  const auto share = [&](std::uint64_t size) {
    const std::uint64_t q = size / world_size, r = size % world_size;
    return q + (std::uint64_t{rank + 1} * r / world_size - std::uint64_t{rank} * r / world_size);
  };
  return full * share(global_batch) + share(rest);
}

void BatchPlan::RankPositions(std::uint64_t k, std::vector<std::uint64_t>& out) const {
  out.clear();
  const std::uint64_t start = k * global_batch;
  if (start >= num_samples) return;
  const std::uint64_t size = std::min(global_batch, num_samples - start);
  if (balanced) {
    // floor(r * size / W) without overflow: size = q*W + rem, and r, rem < W < 2^32.
    const std::uint64_t q = size / world_size, rem = size % world_size;
    const std::uint64_t first = rank * q + std::uint64_t{rank} * rem / world_size;
    const std::uint64_t last = (rank + 1) * q + std::uint64_t{rank + 1} * rem / world_size;
    for (std::uint64_t p = first; p < last; ++p) out.push_back(start + p);
    return;
  }
  const std::uint64_t padded = (size + world_size - 1) / world_size * world_size;
  const std::uint64_t per_rank = padded / world_size;
  for (std::uint64_t i = 0; i < per_rank; ++i) out.push_back((start + rank * per_rank + i) % num_samples);
}

}  // namespace stoker::order
