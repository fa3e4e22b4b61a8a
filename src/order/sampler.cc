#include "order/sampler.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <stop_token>

#include <fmt/format.h>

#include "core/rng.h"

namespace stoker::order {

namespace {

// Fills `order` (N positions, N the sum of shard sizes) with the epoch's
// order, or gives up (false) once `stop` is requested. The Rng's draws do
// not depend on T, so neither does the order.
template <typename T>
bool FillOrder(std::vector<T>& order, const OrderSpec& spec, std::uint64_t epoch, const std::vector<ShardSpan>& shards,
               const std::stop_token& stop) {
  const auto stopped = [&] { return stop.stop_requested(); };
  std::uint64_t n = 0;
  for (const auto& s : shards) n += s.num_samples;
  order.resize(n);
  std::iota(order.begin(), order.end(), T{0});
  Rng rng(spec.seed, epoch);
  switch (spec.mode) {
    case OrderMode::kSequential:
      break;
    case OrderMode::kShuffle:
      return ShuffleUnlessStopped(order.data(), n, rng, stopped);
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
          for (std::uint64_t i = 0; i < s.num_samples; ++i) order[out++] = static_cast<T>(s.first_sample + i);
        }
        if (!ShuffleUnlessStopped(order.data() + begin, out - begin, rng, stopped) || stopped()) return false;
      }
      break;
    }
  }
  return true;
}

}  // namespace

Permutation Permutation::Of(const std::vector<std::uint64_t>& order) {
  Permutation p;
  p.narrow_ = std::all_of(order.begin(), order.end(), [](std::uint64_t s) { return s <= 0xFFFFFFFFu; });
  if (p.narrow_)
    p.narrow_order_.assign(order.begin(), order.end());
  else
    p.wide_order_ = order;
  return p;
}

std::vector<std::uint64_t> Permutation::ToVector() const {
  if (!narrow_) return wide_order_;
  return {narrow_order_.begin(), narrow_order_.end()};
}

bool operator==(const Permutation& a, const Permutation& b) {
  if (a.narrow_ == b.narrow_) return a.narrow_order_ == b.narrow_order_ && a.wide_order_ == b.wide_order_;
  if (a.size() != b.size()) return false;
  for (std::uint64_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return false;
  return true;
}

std::optional<Permutation> Permutation::Make(bool wide, const OrderSpec& spec, std::uint64_t epoch,
                                             const std::vector<ShardSpan>& shards, const std::stop_token& stop) {
  std::uint64_t n = 0;
  for (const auto& s : shards) n += s.num_samples;
  Permutation p;
  p.narrow_ = !wide && n <= (std::uint64_t{1} << 32);  // sample numbers 0 .. n-1 fit in 32 bits
  if (!(p.narrow_ ? FillOrder(p.narrow_order_, spec, epoch, shards, stop)
                  : FillOrder(p.wide_order_, spec, epoch, shards, stop)))
    return std::nullopt;
  return p;
}

Permutation EpochOrderIn(bool wide, const OrderSpec& spec, std::uint64_t epoch, const std::vector<ShardSpan>& shards) {
  return *Permutation::Make(wide, spec, epoch, shards, std::stop_token());  // a default token is never stopped
}

Permutation EpochOrder(const OrderSpec& spec, std::uint64_t epoch, const std::vector<ShardSpan>& shards) {
  return EpochOrderIn(false, spec, epoch, shards);
}

std::optional<Permutation> EpochOrderUnlessStopped(const OrderSpec& spec, std::uint64_t epoch,
                                                   const std::vector<ShardSpan>& shards, const std::stop_token& stop) {
  return Permutation::Make(false, spec, epoch, shards, stop);
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
