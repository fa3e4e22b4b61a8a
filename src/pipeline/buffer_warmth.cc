#include "pipeline/buffer_warmth.h"

#include <algorithm>

namespace stoker::pipeline {

BufferWarmth::BufferWarmth(std::uint32_t slots, bool warm_only)
    : warm_only_(warm_only), warm_(slots, false), waiting_(slots, false), started_(slots, false) {}

std::optional<std::uint32_t> BufferWarmth::SpareWarm(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight,
                                                     std::span<const std::uint32_t> free_slots) const {
  for (auto it = free_slots.rbegin(); it != free_slots.rend(); ++it)
    if (warm_[*it]) return *it;
  auto later = std::find(in_flight.begin(), in_flight.end(), slot);
  if (later == in_flight.end()) return std::nullopt;
  for (++later; later != in_flight.end(); ++later)
    if (warm_[*later] && !started_[*later]) return *later;
  return std::nullopt;
}

bool BufferWarmth::EarlierNeedsWarm(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight) const {
  for (std::uint32_t earlier : in_flight) {
    if (earlier == slot) return false;
    if (!started_[earlier] && !warm_[earlier]) return true;
  }
  return false;
}

std::optional<BufferWarmth::Start> BufferWarmth::TryStart(std::uint32_t slot,
                                                          const std::deque<std::uint32_t>& in_flight,
                                                          std::span<const std::uint32_t> free_slots,
                                                          bool consumer_waits) {
  // Read before an earlier batch that has no warm buffer: that one is to
  // have the next warm buffer (this one's too: SpareWarm finds it here).
  if (warm_only_ && !consumer_waits && EarlierNeedsWarm(slot, in_flight)) return std::nullopt;
  std::optional<Start> start;
  if (warm_[slot]) {
    start = Start{slot, std::nullopt};
  } else if (const auto spare = warm_only_ ? SpareWarm(slot, in_flight, free_slots) : std::nullopt) {
    warm_[*spare] = false;
    warm_[slot] = true;
    start = Start{slot, *spare};
  } else if (!warm_only_ || touched_ < kWorkingSet || consumer_waits) {
    warm_[slot] = true;
    ++touched_;
    start = Start{slot, std::nullopt};
  }
  if (start) started_[slot] = true;
  return start;
}

std::vector<BufferWarmth::Start> BufferWarmth::ReadDone(std::uint32_t slot, const std::deque<std::uint32_t>& in_flight,
                                                        std::span<const std::uint32_t> free_slots,
                                                        std::optional<std::uint32_t> consumer_waits) {
  waiting_[slot] = true;
  return StartWaiting(in_flight, free_slots, consumer_waits);
}

std::vector<BufferWarmth::Start> BufferWarmth::StartWaiting(const std::deque<std::uint32_t>& in_flight,
                                                            std::span<const std::uint32_t> free_slots,
                                                            std::optional<std::uint32_t> consumer_waits) {
  std::vector<Start> started;
  for (std::uint32_t slot : in_flight) {
    if (!waiting_[slot]) continue;
    auto start = TryStart(slot, in_flight, free_slots, consumer_waits == slot);
    if (!start) continue;
    waiting_[slot] = false;
    started.push_back(*start);
  }
  return started;
}

std::vector<std::uint32_t> BufferWarmth::DropWaiting() {
  std::vector<std::uint32_t> dropped;
  for (std::uint32_t slot = 0; slot < waiting_.size(); ++slot) {
    if (!waiting_[slot]) continue;
    waiting_[slot] = false;
    dropped.push_back(slot);
  }
  return dropped;
}

}  // namespace stoker::pipeline
