// ReadAheadAnnouncer: tells a ShardReadPlanner (a remote dataset's cache)
// which shards the loader will read, in order, so that it downloads ahead
// and evicts what is needed furthest ahead. It announces the shard visits
// of an epoch (consecutive repeats collapsed) when the loader starts
// scheduling it, unless they were announced already, and those of the
// following epoch as soon as the loader has them (made ahead on a thread of
// its own, pipeline/order_ahead.h), so that the next epoch's first shards
// arrive before it starts; as reading advances batch by batch it moves the
// planner's position. It keeps the last three epochs announced (the one
// being delivered, the one being scheduled, the next).
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <stop_token>
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

// An epoch's shard visits from batch 0, with each batch's first visit (as
// ShardVisits' `batch_start`): what announcing it appends to the plan.
struct EpochVisits {
  std::vector<std::uint32_t> visits;
  std::vector<std::uint64_t> batch_start;
};

// ShardVisits of a whole epoch, or nothing if `stop` is requested while they
// are listed (asked every 1024 batches): a pass over every position, made
// off the loader's lock with the order (pipeline/order_ahead.h).
[[nodiscard]] std::optional<EpochVisits> EpochVisitsUnlessStopped(const Permutation& order, const BatchPlan& plan,
                                                                  const std::vector<ShardSpan>& shards,
                                                                  const std::stop_token& stop);

class ReadAheadAnnouncer {
 public:
  // `planner` may be null (local data): every call then does nothing.
  ReadAheadAnnouncer(ShardReadPlanner* planner, BatchPlan plan, std::vector<ShardSpan> shards);

  [[nodiscard]] bool active() const { return planner_ != nullptr; }
  // Forgets everything announced (a new epoch started elsewhere, a restore)
  // and announces epoch `epoch` from batch `first` (its order given);
  // reading is at `first`.
  void Restart(std::uint64_t epoch, std::uint64_t first, const Permutation& order);
  // Scheduling moved into epoch `epoch` (its order given, and its visits
  // when they were made ahead): announces it if it is not yet.
  void EpochScheduled(std::uint64_t epoch, const Permutation& order, const EpochVisits* made = nullptr);
  // The visits of epoch `epoch`, made ahead: announced if the epoch before
  // it is announced and it is not (the plan stays in the order of reading).
  void AnnounceAhead(std::uint64_t epoch, const EpochVisits& made);
  // Whether epoch `epoch`'s visits are in the plan.
  [[nodiscard]] bool IsAnnounced(std::uint64_t epoch) const;
  // Reading has reached batch `batch` of epoch `epoch`.
  void Advance(std::uint64_t epoch, std::uint64_t batch);

  // The shard holding dataset sample `sample`.
  [[nodiscard]] std::uint32_t ShardOf(std::uint64_t sample) const;

 private:
  struct Announced {
    std::uint64_t epoch = 0, base = 0, first = 0;
    std::vector<std::uint64_t> batch_start;  // per batch from `first`, plus the end
  };
  void Append(std::uint64_t epoch, std::uint64_t first, const std::vector<std::uint32_t>& visits,
              std::vector<std::uint64_t> batch_start);
  // Lists `order`'s visits from batch `first` here, and appends them.
  void AppendListed(std::uint64_t epoch, std::uint64_t first, const Permutation& order);

  ShardReadPlanner* planner_;
  BatchPlan plan_;
  std::vector<ShardSpan> shards_;
  std::deque<Announced> announced_;
};

}  // namespace stoker::order
