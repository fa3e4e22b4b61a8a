// When to checkpoint: every N steps, every T seconds, or automatically from
// the measured cost of a checkpoint and the job's mean time between failures
// (Young/Daly: T = sqrt(2 * C * M)). Pure: the caller supplies the time.
#pragma once

#include <cstdint>
#include <optional>

#include "stoker/checkpoint.h"

namespace stoker {

class IntervalPolicy {
 public:
  IntervalPolicy(IntervalMode mode, std::uint64_t every_steps, double every_seconds, double mtbf_seconds,
                 double start_seconds);

  [[nodiscard]] bool Due(std::int64_t step, double now_seconds) const;
  // A checkpoint was taken at `step`; it cost training `stall_seconds` and
  // took `persist_seconds` to become durable.
  void OnSaveStarted(std::int64_t step, double now_seconds);
  void OnCostMeasured(double stall_seconds, double persist_seconds);

  // The interval in seconds now in force (kSteps: 0, not time-based).
  [[nodiscard]] double interval_seconds() const;
  // Expected fraction of run time lost to checkpointing: the stall per
  // interval plus the work redone after a failure (half an interval plus the
  // persist time, since the newest durable checkpoint lags by that much).
  [[nodiscard]] double expected_overhead() const;

 private:
  IntervalMode mode_;
  std::uint64_t every_steps_;
  double every_seconds_;
  double mtbf_seconds_;
  double last_save_seconds_;
  std::optional<std::int64_t> last_step_;
  std::optional<double> stall_;    // smoothed
  std::optional<double> persist_;  // smoothed
};

}  // namespace stoker
