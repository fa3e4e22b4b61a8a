// Autotuner: the loader's own choice of worker threads and prefetch depth,
// made online from what it measures (LoaderOptions::autotune). Plain logic
// over measurement windows, no threads or clocks of its own, so its rules
// are tested on synthetic windows:
//
// - The goal: the consumer waits less than `target_wait_share` (2%) of its
//   time between batches, with as few threads as that takes.
// - Waiting too long: one more thread, up to max_threads (the CPU budget);
//   there, while the workers still have time to spare (under 90% busy: the
//   batches come in bursts), one more batch of prefetch, up to
//   max_prefetch (the memory budget); otherwise it says once that the
//   budget cannot keep up.
// - Three calm windows (wait under a quarter of the target) with workers
//   under half busy: one thread fewer. If that brings the wait back, the
//   thread returns and the tuner never lowers again (no oscillation).
// - The first window is warm-up and decides nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace stoker::pipeline {

struct AutotuneLimits {
  std::uint32_t max_threads = 1;
  std::uint32_t max_prefetch = 2;
  double target_wait_share = 0.02;
  std::uint32_t window_batches = 8;
};

class Autotuner {
 public:
  Autotuner(const AutotuneLimits& limits, std::uint32_t threads, std::uint32_t prefetch);

  struct Change {
    std::uint32_t threads = 0, prefetch = 0;
  };
  // One delivered batch: the consumer's time since the previous one
  // (`wall_s`), of which `wait_s` blocked in Next(), and the workers' busy
  // time over it (read + decode + transform, summed over threads). A change
  // to apply at the end of a window, or nullopt.
  [[nodiscard]] std::optional<Change> Observe(double wall_s, double wait_s, double busy_s);

  [[nodiscard]] std::uint32_t threads() const { return threads_; }
  [[nodiscard]] std::uint32_t prefetch() const { return prefetch_; }
  // Each decision, with the batch it was taken at and why (at most the last 64).
  [[nodiscard]] const std::vector<std::string>& log() const { return log_; }
  [[nodiscard]] std::uint64_t changes() const { return changes_; }
  // The batch of the last change (0: none yet).
  [[nodiscard]] std::uint64_t last_change_batch() const { return last_change_batch_; }

 private:
  void Log(std::string line);

  AutotuneLimits limits_;
  std::uint32_t threads_, prefetch_;
  double wall_ = 0, wait_ = 0, busy_ = 0;
  std::uint32_t in_window_ = 0;
  std::uint64_t batches_ = 0, windows_ = 0, changes_ = 0, last_change_batch_ = 0;
  std::uint32_t calm_ = 0;
  bool lowered_ = false, frozen_ = false, said_budget_ = false;
  std::vector<std::string> log_;
};

}  // namespace stoker::pipeline
