#include "pipeline/order_ahead.h"

#include <system_error>
#include <utility>

namespace stoker::pipeline {

OrderAhead::OrderAhead(const order::OrderSpec& spec, const std::vector<order::ShardSpan>& shards)
    : OrderAhead([spec, shards](std::uint64_t epoch, const std::stop_token& stop) {
        return order::EpochOrderUnlessStopped(spec, epoch, shards, stop);
      }) {}

OrderAhead::OrderAhead(Maker make) : make_(std::move(make)) {}

OrderAhead::~OrderAhead() = default;  // ~Making: ~jthread requests stop and joins

void OrderAhead::Start(std::uint64_t epoch) {
  if (Started(epoch)) return;
  making_.reset();  // another epoch's: stopped and joined
  auto making = std::make_unique<Making>();
  making->epoch = epoch;
  Making* m = making.get();
  try {
    m->thread = std::jthread([this, m](std::stop_token stop) {
      try {
        m->order = make_(m->epoch, stop);
      } catch (...) {  // out of memory, say: Take makes it again on its caller's thread, where it is reported
        m->order.reset();
      }
    });
  } catch (const std::system_error&) {
    return;  // no thread to be had (a process at its limit): Take makes the order then, as before
  }
  making_ = std::move(making);
}

std::shared_ptr<const order::Permutation> OrderAhead::Take(std::uint64_t epoch) {
  std::unique_ptr<Making> making = std::move(making_);
  if (making && making->epoch == epoch) {
    making->thread.join();
    if (making->order) {
      ++taken_ahead_;
      return std::make_shared<const order::Permutation>(std::move(*making->order));
    }
  }
  making.reset();  // a stale one: stopped and joined before this one is made
  // A token that is never stopped: the order is always made.
  return std::make_shared<const order::Permutation>(make_(epoch, std::stop_token()).value());
}

}  // namespace stoker::pipeline
