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
// Not thread-safe: the loader calls it under its lock. The thread it starts
// reads only its own copies of the spec and the shards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "order/sampler.h"

namespace stoker::pipeline {

class OrderAhead {
 public:
  // Makes an epoch's order; nothing if the token was stopped first.
  using Maker = std::function<std::optional<order::Permutation>(std::uint64_t epoch, const std::stop_token& stop)>;

  // Orders made by EpochOrderUnlessStopped(spec, epoch, shards).
  OrderAhead(const order::OrderSpec& spec, const std::vector<order::ShardSpan>& shards);
  explicit OrderAhead(Maker make);
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
  // held ahead afterwards.
  [[nodiscard]] std::shared_ptr<const order::Permutation> Take(std::uint64_t epoch);

  // How many Takes found their order started ahead (tests, statistics).
  [[nodiscard]] std::uint64_t taken_ahead() const { return taken_ahead_; }

 private:
  struct Making {
    std::uint64_t epoch = 0;
    std::optional<order::Permutation> order;  // written by `thread` alone until it is joined
    std::jthread thread;                      // last: stopped and joined before `order` goes
  };
  Maker make_;
  std::unique_ptr<Making> making_;
  std::uint64_t taken_ahead_ = 0;
};

}  // namespace stoker::pipeline
