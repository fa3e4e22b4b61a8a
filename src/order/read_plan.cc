#include "order/read_plan.h"

#include <algorithm>

namespace stoker::order {

namespace {

std::uint32_t ShardOfSample(const std::vector<ShardSpan>& shards, std::uint64_t sample) {
  auto it = std::upper_bound(shards.begin(), shards.end(), sample,
                             [](std::uint64_t v, const ShardSpan& s) { return v < s.first_sample; });
  return static_cast<std::uint32_t>(it == shards.begin() ? 0 : (it - shards.begin()) - 1);
}

}  // namespace

ReadAheadAnnouncer::ReadAheadAnnouncer(ShardReadPlanner* planner, OrderSpec spec, BatchPlan plan,
                                       std::vector<ShardSpan> shards)
    : planner_(planner), spec_(spec), plan_(plan), shards_(std::move(shards)) {}

std::uint32_t ReadAheadAnnouncer::ShardOf(std::uint64_t sample) const {
  return ShardOfSample(shards_, sample);
}

bool ReadAheadAnnouncer::IsAnnounced(std::uint64_t epoch) const {
  return std::any_of(announced_.begin(), announced_.end(), [&](const Announced& a) { return a.epoch == epoch; });
}

std::vector<std::uint32_t> ShardVisits(const Permutation& order, const BatchPlan& plan,
                                       const std::vector<ShardSpan>& shards, std::uint64_t first,
                                       std::vector<std::uint64_t>* batch_start) {
  std::vector<std::uint32_t> visits;
  std::vector<std::uint64_t> positions;
  auto shard_of = [&](std::uint64_t sample) { return ShardOfSample(shards, sample); };
  for (std::uint64_t b = first; b < plan.NumBatches(); ++b) {
    plan.RankPositions(b, positions);
    // A batch that starts in the shard the previous one ended in starts at
    // that visit: until it is delivered, the shard is still being read
    // (counting from the next visit let the cache evict a shard in use).
    if (batch_start) {
      const bool continues = !positions.empty() && !visits.empty() && visits.back() == shard_of(order[positions[0]]);
      batch_start->push_back(continues ? visits.size() - 1 : visits.size());
    }
    for (std::uint64_t pos : positions) {
      const std::uint32_t shard = shard_of(order[pos]);
      if (visits.empty() || visits.back() != shard) visits.push_back(shard);
    }
  }
  if (batch_start) batch_start->push_back(visits.size());
  return visits;
}

void ReadAheadAnnouncer::Announce(std::uint64_t epoch, std::uint64_t first, const Permutation& order, bool and_next) {
  if (!IsAnnounced(epoch)) {
    Announced a;
    a.epoch = epoch;
    a.first = first;
    const std::vector<std::uint32_t> visits = ShardVisits(order, plan_, shards_, first, &a.batch_start);
    a.base = planner_->AppendPlan(visits);
    announced_.push_back(std::move(a));
    while (announced_.size() > 3) announced_.pop_front();
  }
  if (and_next && !IsAnnounced(epoch + 1)) Announce(epoch + 1, 0, EpochOrder(spec_, epoch + 1, shards_), false);
}

void ReadAheadAnnouncer::Restart(std::uint64_t epoch, std::uint64_t first, const Permutation& order) {
  if (planner_ == nullptr) return;
  planner_->ResetPlan();
  announced_.clear();
  Announce(epoch, first, order, true);
  Advance(epoch, first);
}

void ReadAheadAnnouncer::EpochScheduled(std::uint64_t epoch, const Permutation& order) {
  if (planner_ == nullptr) return;
  Announce(epoch, 0, order, true);
}

void ReadAheadAnnouncer::Advance(std::uint64_t epoch, std::uint64_t batch) {
  if (planner_ == nullptr) return;
  for (const auto& a : announced_)
    if (a.epoch == epoch && batch >= a.first && batch - a.first < a.batch_start.size())
      planner_->AdvancePlan(a.base + a.batch_start[batch - a.first]);
}

}  // namespace stoker::order
