// `stoker bench --consumer-ms`: a simulated accelerator step after each
// batch, and the share of the wall time it computed (accelerator
// utilisation, as MLPerf Storage defines AU). Shared by the image and the
// token benches.
#pragma once

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stoker/status.h"

namespace stoker_cli {

class SimulatedStep {
 public:
  // InvalidArgument unless `ms` is a finite number of milliseconds from 0 to an hour.
  [[nodiscard]] static stoker::Status Check(double ms) {
    if (std::isfinite(ms) && ms >= 0 && ms <= 3.6e6) return stoker::Status::Ok();
    return stoker::Status::InvalidArgument(
        fmt::format("--consumer-ms {} must be a finite number of milliseconds, 0 or more", ms));
  }

  explicit SimulatedStep(double ms) : ms_(ms) {}

  // One step (nothing without --consumer-ms); its time counts as computing.
  void Run() {
    if (ms_ <= 0) return;
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms_));
    computed_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  void StartEpoch() { computed_s_ = 0; }

  // ", accelerator utilization X% (idle Y%)" for an epoch of `wall` seconds; "" without a step.
  [[nodiscard]] std::string Text(double wall) const {
    if (ms_ <= 0) return "";
    return fmt::format(", accelerator utilization {:.1f}% (idle {:.1f}%)", 100.0 * computed_s_ / wall,
                       100.0 * (1.0 - computed_s_ / wall));
  }
  void AddTo(nlohmann::json& epoch, double wall) const {
    if (ms_ <= 0) return;
    epoch["consumer_ms"] = ms_;
    epoch["accelerator_utilization"] = computed_s_ / wall;
    epoch["idle_percent"] = 100.0 * (1.0 - computed_s_ / wall);
  }

 private:
  double ms_;
  double computed_s_ = 0;
};

}  // namespace stoker_cli
