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

ReadAheadAnnouncer::ReadAheadAnnouncer(ShardReadPlanner* planner, BatchPlan plan, std::vector<ShardSpan> shards)
    : planner_(planner), plan_(plan), shards_(std::move(shards)) {}

std::uint32_t ReadAheadAnnouncer::ShardOf(std::uint64_t sample) const {
  return ShardOfSample(shards_, sample);
}

bool ReadAheadAnnouncer::IsAnnounced(std::uint64_t epoch) const {
  return std::any_of(announced_.begin(), announced_.end(), [&](const Announced& a) { return a.epoch == epoch; });
}

namespace {

// ShardVisits, asking `stop` (when given) every 1024 batches: false once it is requested.
bool ListVisits(const Permutation& order, const BatchPlan& plan, const std::vector<ShardSpan>& shards,
                std::uint64_t first, std::vector<std::uint32_t>& visits, std::vector<std::uint64_t>* batch_start,
                const std::stop_token* stop) {
  std::vector<std::uint64_t> positions;
  auto shard_of = [&](std::uint64_t sample) { return ShardOfSample(shards, sample); };
  for (std::uint64_t b = first; b < plan.NumBatches(); ++b) {
    if (stop != nullptr && (b - first) % 1024 == 0 && stop->stop_requested()) return false;
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
  return true;
}

}  // namespace

std::vector<std::uint32_t> ShardVisits(const Permutation& order, const BatchPlan& plan,
                                       const std::vector<ShardSpan>& shards, std::uint64_t first,
                                       std::vector<std::uint64_t>* batch_start) {
  std::vector<std::uint32_t> visits;
  (void)ListVisits(order, plan, shards, first, visits, batch_start, nullptr);
  return visits;
}

std::optional<EpochVisits> EpochVisitsUnlessStopped(const Permutation& order, const BatchPlan& plan,
                                                    const std::vector<ShardSpan>& shards, const std::stop_token& stop) {
  EpochVisits made;
  if (!ListVisits(order, plan, shards, 0, made.visits, &made.batch_start, &stop)) return std::nullopt;
  return made;
}

void ReadAheadAnnouncer::Append(std::uint64_t epoch, std::uint64_t first, const std::vector<std::uint32_t>& visits,
                                std::vector<std::uint64_t> batch_start) {
  Announced a;
  a.epoch = epoch;
  a.first = first;
  a.batch_start = std::move(batch_start);
  a.base = planner_->AppendPlan(visits);
  announced_.push_back(std::move(a));
  while (announced_.size() > 3) announced_.pop_front();
}

void ReadAheadAnnouncer::AppendListed(std::uint64_t epoch, std::uint64_t first, const Permutation& order) {
  std::vector<std::uint64_t> batch_start;
  const std::vector<std::uint32_t> visits = ShardVisits(order, plan_, shards_, first, &batch_start);
  Append(epoch, first, visits, std::move(batch_start));
}

void ReadAheadAnnouncer::Restart(std::uint64_t epoch, std::uint64_t first, const Permutation& order) {
  if (planner_ == nullptr) return;
  planner_->ResetPlan();
  announced_.clear();
  AppendListed(epoch, first, order);
  Advance(epoch, first);
}

void ReadAheadAnnouncer::EpochScheduled(std::uint64_t epoch, const Permutation& order, const EpochVisits* made) {
  if (planner_ == nullptr || IsAnnounced(epoch)) return;
  if (made != nullptr) {
    Append(epoch, 0, made->visits, made->batch_start);
  } else {
    AppendListed(epoch, 0, order);  // not made ahead (a thread refused, a failed making)
  }
}

void ReadAheadAnnouncer::AnnounceAhead(std::uint64_t epoch, const EpochVisits& made) {
  if (planner_ == nullptr || epoch == 0 || !IsAnnounced(epoch - 1) || IsAnnounced(epoch)) return;
  Append(epoch, 0, made.visits, made.batch_start);
}

void ReadAheadAnnouncer::Advance(std::uint64_t epoch, std::uint64_t batch) {
  if (planner_ == nullptr) return;
  for (const auto& a : announced_)
    if (a.epoch == epoch && batch >= a.first && batch - a.first < a.batch_start.size())
      planner_->AdvancePlan(a.base + a.batch_start[batch - a.first]);
}

}  // namespace stoker::order
