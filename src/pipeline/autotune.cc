#include "pipeline/autotune.h"

#include <fmt/format.h>

namespace stoker::pipeline {

Autotuner::Autotuner(const AutotuneLimits& limits, std::uint32_t threads, std::uint32_t prefetch)
    : limits_(limits), threads_(threads), prefetch_(prefetch) {}

void Autotuner::Log(std::string line) {
  if (log_.size() == 64) log_.erase(log_.begin());
  log_.push_back(std::move(line));
}

std::optional<Autotuner::Change> Autotuner::Observe(double wall_s, double wait_s, double busy_s) {
  ++batches_;
  wall_ += wall_s;
  wait_ += wait_s;
  busy_ += busy_s;
  if (++in_window_ < limits_.window_batches) return std::nullopt;
  const double wall = wall_, wait = wait_, busy = busy_;
  wall_ = wait_ = busy_ = 0;
  in_window_ = 0;
  if (windows_++ == 0 || wall <= 0) return std::nullopt;  // warm-up: the pipeline is still filling
  const double share = wait / wall;
  const double utilisation = busy / (static_cast<double>(threads_) * wall);
  const double target = limits_.target_wait_share;
  const std::uint32_t threads = threads_, prefetch = prefetch_;
  if (share > target) {
    calm_ = 0;
    if (threads_ < limits_.max_threads) {
      ++threads_;
      if (lowered_) frozen_ = true;  // the last decrease went too far
      Log(fmt::format("batch {}: threads {} -> {}: the consumer waited {:.1f}% of its time (target under {:.0f}%)",
                      batches_, threads, threads_, 100 * share, 100 * target));
    } else if (prefetch_ < limits_.max_prefetch && utilisation < 0.9) {
      // Workers with time to spare while the consumer waits: the batches come in bursts, which a deeper
      // queue smooths. Saturated workers gain nothing from it.
      ++prefetch_;
      Log(fmt::format("batch {}: prefetch {} -> {}: waited {:.1f}% with all {} threads of the CPU budget", batches_,
                      prefetch, prefetch_, 100 * share, threads_));
    } else if (!said_budget_) {
      said_budget_ = true;
      Log(
          fmt::format("batch {}: waited {:.1f}% at the budget ({} threads, prefetch {}): the loader cannot keep up "
                      "(raise autotune_max_threads, or lighten the work: gpu_preprocess, decode on the GPU)",
                      batches_, 100 * share, threads_, prefetch_));
    }
  } else if (share < target / 4 && !frozen_) {
    if (++calm_ >= 3 && utilisation < 0.5 && threads_ > 1) {
      --threads_;
      lowered_ = true;
      calm_ = 0;
      Log(
          fmt::format("batch {}: threads {} -> {}: workers {:.0f}% busy and the consumer waited {:.2f}%: a core "
                      "freed",
                      batches_, threads, threads_, 100 * utilisation, 100 * share));
    }
  } else {
    calm_ = 0;
  }
  if (threads_ == threads && prefetch_ == prefetch) return std::nullopt;
  ++changes_;
  last_change_batch_ = batches_;
  return Change{threads_, prefetch_};
}

}  // namespace stoker::pipeline
