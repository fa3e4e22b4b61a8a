#include "pipeline/order_ahead.h"

#include <system_error>
#include <utility>

namespace stoker::pipeline {

OrderAhead::OrderAhead(const order::OrderSpec& spec, const std::vector<order::ShardSpan>& shards,
                       std::optional<order::BatchPlan> visits_of)
    : OrderAhead(
          [spec, shards](std::uint64_t epoch, const std::stop_token& stop) {
            return order::EpochOrderUnlessStopped(spec, epoch, shards, stop);
          },
          visits_of
              ? VisitsMaker([plan = *visits_of, shards](const order::Permutation& order, const std::stop_token& stop) {
                  return order::EpochVisitsUnlessStopped(order, plan, shards, stop);
                })
              : VisitsMaker()) {}

OrderAhead::OrderAhead(Maker make, VisitsMaker visits) : make_(std::move(make)), visits_(std::move(visits)) {}

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
        if (m->order && visits_) m->visits = visits_(*m->order, stop);
      } catch (...) {  // out of memory, say: Take makes it again on its caller's thread, where it is reported
        m->order.reset();
        m->visits.reset();
      }
      m->done.store(true, std::memory_order_release);
    });
  } catch (const std::system_error&) {
    return;  // no thread to be had (a process at its limit): Take makes the order then, as before
  }
  making_ = std::move(making);
}

OrderAhead::ReadyVisits OrderAhead::Ready() const {
  if (!making_ || !making_->done.load(std::memory_order_acquire) || !making_->visits) return {};
  return {making_->epoch, &*making_->visits};
}

std::shared_ptr<const order::Permutation> OrderAhead::Take(std::uint64_t epoch,
                                                           std::optional<order::EpochVisits>* visits) {
  if (visits != nullptr) visits->reset();
  std::unique_ptr<Making> making = std::move(making_);
  if (making && making->epoch == epoch) {
    making->thread.join();
    if (making->order) {
      ++taken_ahead_;
      if (visits != nullptr) *visits = std::move(making->visits);
      return std::make_shared<const order::Permutation>(std::move(*making->order));
    }
  }
  making.reset();  // a stale one: stopped and joined before this one is made
  // A token that is never stopped: the order is always made.
  return std::make_shared<const order::Permutation>(make_(epoch, std::stop_token()).value());
}

}  // namespace stoker::pipeline
