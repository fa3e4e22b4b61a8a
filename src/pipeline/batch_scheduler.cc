#include "pipeline/batch_scheduler.h"

#include <algorithm>
#include <iterator>

namespace stoker::pipeline {

BatchScheduler::BatchScheduler(std::uint32_t slots, std::uint32_t prefetch, std::uint64_t batches_per_epoch)
    : prefetch_(prefetch), batches_per_epoch_(batches_per_epoch), reserve_(slots >= 3 ? slots - 1 : kNoReserve) {
  for (std::uint32_t i = slots; i-- > 0;) free_.push_back(i);
}

void BatchScheduler::StartEpoch(std::uint64_t epoch, std::uint64_t consumed) {
  epoch_ = schedule_epoch_ = epoch;
  next_to_deliver_ = next_to_schedule_ = consumed;
}

std::optional<ScheduledBatch> BatchScheduler::ScheduleNext(bool may_use_reserve) {
  if (free_.empty() || in_flight_.size() >= prefetch_ || batches_per_epoch_ == 0) return std::nullopt;
  // The most recently freed slot other than the reserve (LIFO: the fewest
  // buffers touched); the reserve only where allowed.
  auto pick = std::find_if(free_.rbegin(), free_.rend(), [this](std::uint32_t s) { return s != reserve_; });
  if (pick == free_.rend() && !may_use_reserve) return std::nullopt;
  if (pick == free_.rend()) pick = free_.rbegin();
  bool starts_epoch = false;
  if (next_to_schedule_ >= batches_per_epoch_) {
    // Run ahead into the next epoch, at most one epoch ahead of delivery.
    if (schedule_epoch_ > epoch_) return std::nullopt;
    ++schedule_epoch_;
    next_to_schedule_ = 0;
    starts_epoch = true;
  }
  const std::uint32_t slot = *pick;
  free_.erase(std::prev(pick.base()));
  in_flight_.push_back(slot);
  return ScheduledBatch{slot, schedule_epoch_, next_to_schedule_++, starts_epoch};
}

void BatchScheduler::QueueRead(std::uint32_t slot) {
  const auto first_sample =
      std::find_if(queue_.begin(), queue_.end(), [](const WorkItem& w) { return w.kind != ItemKind::kReadBatch; });
  queue_.insert(first_sample, WorkItem{ItemKind::kReadBatch, slot, 0});
}

void BatchScheduler::QueueSamples(std::uint32_t slot, std::uint32_t count) {
  for (std::uint32_t i = 0; i < count; ++i) queue_.push_back(WorkItem{ItemKind::kSample, slot, i});
}

std::optional<WorkItem> BatchScheduler::PopWork() {
  if (queue_.empty()) return std::nullopt;
  WorkItem item = queue_.front();
  queue_.pop_front();
  return item;
}

std::vector<WorkItem> BatchScheduler::DropQueued() {
  std::vector<WorkItem> dropped(queue_.begin(), queue_.end());
  queue_.clear();
  return dropped;
}

void BatchScheduler::NextEpoch() {
  ++epoch_;
  next_to_deliver_ = 0;
}

std::optional<std::uint32_t> BatchScheduler::NextInFlight() const {
  if (in_flight_.empty()) return std::nullopt;
  return in_flight_.front();
}

void BatchScheduler::Delivered() {
  in_flight_.pop_front();
  ++next_to_deliver_;
}

void BatchScheduler::Release(std::uint32_t slot) {
  free_.push_back(slot);
}

void BatchScheduler::ReclaimInFlight() {
  for (std::uint32_t s : in_flight_) free_.push_back(s);
  in_flight_.clear();
}

}  // namespace stoker::pipeline
