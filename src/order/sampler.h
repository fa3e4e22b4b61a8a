// The sampler: which samples each rank reads, in which order. Pure functions
// of (seed, epoch, dataset shape, global batch size, world size, rank), so
// the order never depends on threads or timing, and resuming needs only the
// epoch and the number of global batches already consumed.
#pragma once

#include <cstdint>
#include <optional>
#include <stop_token>
#include <vector>

#include "stoker/status.h"

namespace stoker::order {

enum class OrderMode : std::uint8_t {
  kSequential,         // index order
  kShuffle,            // a full random permutation per epoch
  kShardBlockShuffle,  // shuffle shards, then samples within windows of `window` shards
};

struct ShardSpan {
  std::uint64_t first_sample;
  std::uint64_t num_samples;
};

struct OrderSpec {
  OrderMode mode = OrderMode::kShuffle;
  std::uint64_t seed = 0;
  std::uint32_t shard_window = 8;  // kShardBlockShuffle only
};

// An epoch's order: position -> dataset sample, a permutation of [0, N).
// Held in 4 bytes a position while every sample number fits in 32 bits
// (datasets of under 2^32 samples), else in 8: the same order either way.
// Each rank holds one or two (the epoch delivered and, for its last tenth,
// the next, made ahead), so at a billion samples this is 4-8 GB a rank,
// not 8-16.
class Permutation {
 public:
  Permutation() = default;
  // An order given position by position (each a sample number).
  [[nodiscard]] static Permutation Of(const std::vector<std::uint64_t>& order);
  [[nodiscard]] std::uint64_t size() const { return narrow_ ? narrow_order_.size() : wide_order_.size(); }
  [[nodiscard]] std::uint64_t operator[](std::uint64_t position) const {
    return narrow_ ? narrow_order_[position] : wide_order_[position];
  }
  [[nodiscard]] bool narrow() const { return narrow_; }
  [[nodiscard]] std::vector<std::uint64_t> ToVector() const;
  // The same order, whatever the width it is held in.
  friend bool operator==(const Permutation& a, const Permutation& b);

 private:
  // The epoch's order in 8 bytes a position (`wide`) or as EpochOrder holds
  // it; nothing if `stop` was requested first.
  static std::optional<Permutation> Make(bool wide, const OrderSpec& spec, std::uint64_t epoch,
                                         const std::vector<ShardSpan>& shards, const std::stop_token& stop);
  friend Permutation EpochOrderIn(bool wide, const OrderSpec& spec, std::uint64_t epoch,
                                  const std::vector<ShardSpan>& shards);
  friend std::optional<Permutation> EpochOrderUnlessStopped(const OrderSpec& spec, std::uint64_t epoch,
                                                            const std::vector<ShardSpan>& shards,
                                                            const std::stop_token& stop);
  bool narrow_ = true;
  std::vector<std::uint32_t> narrow_order_;
  std::vector<std::uint64_t> wide_order_;
};

// The epoch's order: a permutation of [0, N), N = the sum of shard sizes.
[[nodiscard]] Permutation EpochOrder(const OrderSpec& spec, std::uint64_t epoch, const std::vector<ShardSpan>& shards);
// The same order, or nothing if `stop` is requested while it is made (it is
// asked every 2^20 positions): for making it on a thread that may be told
// the order is no longer wanted (pipeline/order_ahead.h).
[[nodiscard]] std::optional<Permutation> EpochOrderUnlessStopped(const OrderSpec& spec, std::uint64_t epoch,
                                                                 const std::vector<ShardSpan>& shards,
                                                                 const std::stop_token& stop);
// The same order held in 8 bytes a position whatever N (`wide`), or as
// EpochOrder holds it: for tests that the width changes nothing.
[[nodiscard]] Permutation EpochOrderIn(bool wide, const OrderSpec& spec, std::uint64_t epoch,
                                       const std::vector<ShardSpan>& shards);

// How an epoch's order is cut into global batches of B samples, and each
// global batch split across W ranks.
// - Even split (balanced = false): B must be a multiple of W; each rank
//   takes a contiguous B/W. Without drop_last, the last partial global batch
//   is padded by wrapping around to the epoch's start, to a multiple of W, so
//   every rank gets the same number of samples (as DistributedSampler does).
// - Balanced split (elastic training): any B and W; rank r takes the
//   contiguous [floor(r*b/W), floor((r+1)*b/W)) of a global batch of b
//   samples. Nothing is padded, so each sample is in exactly one rank's
//   batch once per epoch, whatever W was when each batch was taken.
struct BatchPlan {
  std::uint64_t num_samples = 0;
  std::uint64_t global_batch = 1;
  std::uint32_t world_size = 1;
  std::uint32_t rank = 0;
  bool drop_last = false;
  bool balanced = false;

  [[nodiscard]] Status Validate() const;
  // The most samples a rank takes from one global batch.
  [[nodiscard]] std::uint64_t MaxRankBatch() const;
  [[nodiscard]] std::uint64_t NumBatches() const;
  // Samples this rank takes an epoch: the sum of RankPositions' sizes
  // (DistributedSampler's len() for the even split).
  [[nodiscard]] std::uint64_t RankSamplesPerEpoch() const;
  // Positions (into the epoch order) of this rank's part of global batch k.
  void RankPositions(std::uint64_t k, std::vector<std::uint64_t>& out) const;
};

}  // namespace stoker::order
