// ReadAheadAnnouncer: tells a ShardReadPlanner (a remote dataset's cache)
// which shards the loader will read, in order, so that it downloads ahead
// and evicts what is needed furthest ahead. It announces the shard visits
// of an epoch (consecutive repeats collapsed) when the loader starts
// scheduling it, and those of the following epoch too, so that the next
// epoch's first shards arrive before it starts; as reading advances batch by
// batch it moves the planner's position. It keeps the last three epochs
// announced (the one being delivered, the one being scheduled, the next).
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "order/sampler.h"
#include "stoker/file_system.h"

namespace stoker::order {

// The shards this rank visits reading `order` (an epoch's order) from batch
// `first` on, consecutive repeats collapsed. `batch_start`, when given,
// receives per batch the index of its first visit (a batch that continues
// the previous batch's shard starts at that shard's visit), then the end.
[[nodiscard]] std::vector<std::uint32_t> ShardVisits(const Permutation& order, const BatchPlan& plan,
                                                     const std::vector<ShardSpan>& shards, std::uint64_t first,
                                                     std::vector<std::uint64_t>* batch_start = nullptr);

class ReadAheadAnnouncer {
 public:
  // `planner` may be null (local data): every call then does nothing.
  ReadAheadAnnouncer(ShardReadPlanner* planner, OrderSpec spec, BatchPlan plan, std::vector<ShardSpan> shards);

  [[nodiscard]] bool active() const { return planner_ != nullptr; }
  // Forgets everything announced (a new epoch started elsewhere, a restore)
  // and announces epoch `epoch` from batch `first` (its order given), plus
  // the epoch after it; reading is at `first`.
  void Restart(std::uint64_t epoch, std::uint64_t first, const Permutation& order);
  // Scheduling moved into epoch `epoch` (its order given): announces it if
  // it is not yet, and the one after.
  void EpochScheduled(std::uint64_t epoch, const Permutation& order);
  // Reading has reached batch `batch` of epoch `epoch`.
  void Advance(std::uint64_t epoch, std::uint64_t batch);

  // The shard holding dataset sample `sample`.
  [[nodiscard]] std::uint32_t ShardOf(std::uint64_t sample) const;

 private:
  struct Announced {
    std::uint64_t epoch = 0, base = 0, first = 0;
    std::vector<std::uint64_t> batch_start;  // per batch from `first`, plus the end
  };
  [[nodiscard]] bool IsAnnounced(std::uint64_t epoch) const;
  void Announce(std::uint64_t epoch, std::uint64_t first, const Permutation& order, bool and_next);

  ShardReadPlanner* planner_;
  OrderSpec spec_;
  BatchPlan plan_;
  std::vector<ShardSpan> shards_;
  std::deque<Announced> announced_;
};

}  // namespace stoker::order
