// OrderAhead: the next epoch's order, made on a thread of its own while this
// epoch is delivered.
//
// A full shuffle's order is a pass over every sample: 1.5 s at 100 M
// samples, 19 s at a billion (2 cores). Made when scheduling reached the
// epoch, it was made under the loader's lock, and the workers, which take
// their work under that lock, waited with it. The loader starts the next
// epoch's order here once nine tenths of an epoch are scheduled (so a rank
// holds two orders for the last tenth, not only at the boundary) and takes
// it when scheduling reaches that epoch, waiting only for what is left of
// its making.
//
// Over a remote dataset the loader starts the next epoch's order as soon as
// scheduling enters an epoch, and the thread lists that order's shard visits
// too (order/read_plan.h): the remote cache is told the next epoch's reads
// while this one is read (so that its first shards arrive before it starts),
// and neither the order nor the visits are made under the loader's lock.
//
// Not thread-safe: the loader calls it under its lock. The thread it starts
// reads only its own copies of the spec, the shards and the batch plan.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "order/read_plan.h"
#include "order/sampler.h"

namespace stoker::pipeline {

class OrderAhead {
 public:
  // Makes an epoch's order; nothing if the token was stopped first.
  using Maker = std::function<std::optional<order::Permutation>(std::uint64_t epoch, const std::stop_token& stop)>;
  // Lists a made order's shard visits; nothing if the token was stopped first.
  using VisitsMaker =
      std::function<std::optional<order::EpochVisits>(const order::Permutation& order, const std::stop_token& stop)>;

  // Orders made by EpochOrderUnlessStopped(spec, epoch, shards); with
  // `visits_of`, each made ahead comes with its EpochVisitsUnlessStopped
  // for that rank's batch plan.
  OrderAhead(const order::OrderSpec& spec, const std::vector<order::ShardSpan>& shards,
             std::optional<order::BatchPlan> visits_of = std::nullopt);
  explicit OrderAhead(Maker make, VisitsMaker visits = nullptr);
  // Stops a making in flight and waits for it to give up (milliseconds).
  ~OrderAhead();
  OrderAhead(const OrderAhead&) = delete;
  OrderAhead& operator=(const OrderAhead&) = delete;

  // Starts making `epoch`'s order on a thread of its own, unless it is
  // being made or made already; a making of another epoch is dropped.
  // Where the system gives no thread, nothing starts and Take makes it.
  void Start(std::uint64_t epoch);
  // Whether `epoch`'s order is being made or made ahead.
  [[nodiscard]] bool Started(std::uint64_t epoch) const { return making_ && making_->epoch == epoch; }

  // `epoch`'s order: the one made ahead (waiting for the rest of its
  // making), else made now on the caller's thread. Either way nothing is
  // held ahead afterwards. `visits`, when given, receives the visits made
  // ahead with it, if any (never made on the caller's thread).
  [[nodiscard]] std::shared_ptr<const order::Permutation> Take(std::uint64_t epoch,
                                                               std::optional<order::EpochVisits>* visits = nullptr);

  // The visits of the order being made ahead, once its making is done
  // (without waiting): its epoch and them, valid until the next Start or
  // Take; nullptr while it is still made, or where none are made.
  struct ReadyVisits {
    std::uint64_t epoch = 0;
    const order::EpochVisits* visits = nullptr;
  };
  [[nodiscard]] ReadyVisits Ready() const;

  // How many Takes found their order started ahead (tests, statistics).
  [[nodiscard]] std::uint64_t taken_ahead() const { return taken_ahead_; }

 private:
  struct Making {
    std::uint64_t epoch = 0;
    // Written by `thread` alone until `done` is set (release) or it is joined.
    std::optional<order::Permutation> order;
    std::optional<order::EpochVisits> visits;
    std::atomic<bool> done{false};
    std::jthread thread;  // last: stopped and joined before what it writes goes
  };
  Maker make_;
  VisitsMaker visits_;
  std::unique_ptr<Making> making_;
  std::uint64_t taken_ahead_ = 0;
};

}  // namespace stoker::pipeline
