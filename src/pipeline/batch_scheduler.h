// BatchScheduler: the loader's bookkeeping of batch slots, work items and
// epochs, without threads or locks of its own (the loader calls it under its
// mutex), so that the scheduling rules are tested on their own:
//
// - A batch goes into a free slot while fewer than `prefetch` are in flight;
//   scheduling runs ahead across an epoch's end into the next epoch (at most
//   one epoch ahead of delivery), so a new epoch starts with batches ready.
// - A batch is first one read item (all its samples' bytes at once), queued
//   ahead of the sample items already waiting but behind earlier reads: a
//   batch's samples can start only once it is read, and a read queued behind
//   the last batch's samples would leave threads idle. Once read, it becomes
//   one sample item per sample at the back of the queue.
// - Delivery is strictly in scheduling order.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

namespace stoker::pipeline {

enum class ItemKind : std::uint8_t { kReadBatch, kSample };
struct WorkItem {
  ItemKind kind = ItemKind::kSample;
  std::uint32_t slot = 0;
  std::uint32_t index = 0;  // kSample: the sample's place in the batch
};

// A batch just given a slot.
struct ScheduledBatch {
  std::uint32_t slot = 0;
  std::uint64_t epoch = 0;
  std::uint64_t batch = 0;    // within the epoch
  bool starts_epoch = false;  // the first batch scheduled in a new epoch
};

class BatchScheduler {
 public:
  BatchScheduler(std::uint32_t slots, std::uint32_t prefetch, std::uint64_t batches_per_epoch);

  // Delivery and scheduling restart at batch `consumed` of `epoch`. Nothing
  // may be in flight (DropQueued, wait for started items, then ReclaimInFlight).
  void StartEpoch(std::uint64_t epoch, std::uint64_t consumed);

  // The next batch to schedule, now given its slot, or nullopt (no free
  // slot, `prefetch` in flight, or a whole epoch ahead of delivery). The
  // last slot (of 3 or more) is a reserve, given only `may_use_reserve`:
  // the loader withholds it right after a delivery, when a loop that holds
  // one batch holds two for a moment, so such a loop never touches its
  // buffer's pages; a consumer that keeps two or more gets it when it asks
  // for the next or releases one.
  [[nodiscard]] std::optional<ScheduledBatch> ScheduleNext(bool may_use_reserve = true);

  // The work queue.
  void QueueRead(std::uint32_t slot);
  void QueueSamples(std::uint32_t slot, std::uint32_t count);
  [[nodiscard]] std::optional<WorkItem> PopWork();
  [[nodiscard]] bool HasWork() const { return !queue_.empty(); }
  // Removes every queued item (started ones are the caller's to wait for)
  // and returns them.
  std::vector<WorkItem> DropQueued();

  // Delivery. The epoch being delivered and its next batch.
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  [[nodiscard]] std::uint64_t next_to_deliver() const { return next_to_deliver_; }
  [[nodiscard]] bool EpochDelivered() const { return next_to_deliver_ >= batches_per_epoch_; }
  // Delivery moves on to the following epoch.
  void NextEpoch();
  // The slot of the next batch to deliver, if one is in flight.
  [[nodiscard]] std::optional<std::uint32_t> NextInFlight() const;
  // That batch was delivered (or failed): it leaves the in-flight list.
  void Delivered();
  // The consumer gave the slot back.
  void Release(std::uint32_t slot);
  // Slots in flight, in delivery order.
  [[nodiscard]] const std::deque<std::uint32_t>& in_flight() const { return in_flight_; }
  // After a drain: every in-flight slot becomes free.
  void ReclaimInFlight();
  [[nodiscard]] std::size_t free_slots() const { return free_.size(); }
  // The free slots, most recently freed last.
  [[nodiscard]] std::span<const std::uint32_t> free_list() const { return free_; }
  // Batches in flight at most from now on (autotune); at least 1. Lowering
  // it lets the batches already in flight finish.
  void SetPrefetch(std::uint32_t prefetch) { prefetch_ = prefetch > 0 ? prefetch : 1; }

 private:
  std::uint32_t prefetch_;
  std::uint64_t batches_per_epoch_;
  std::vector<std::uint32_t> free_;
  std::deque<WorkItem> queue_;
  std::deque<std::uint32_t> in_flight_;
  std::uint64_t epoch_ = 0, next_to_deliver_ = 0;
  std::uint64_t schedule_epoch_ = 0, next_to_schedule_ = 0;
  static constexpr std::uint32_t kNoReserve = ~std::uint32_t{0};
  std::uint32_t reserve_;
};

}  // namespace stoker::pipeline
