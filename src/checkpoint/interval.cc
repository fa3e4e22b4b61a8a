#include "checkpoint/interval.h"

#include <algorithm>
#include <cmath>

namespace stoker {
namespace {
// Costs vary from one checkpoint to the next (page cache, disk contention);
// smooth them so one outlier does not swing the interval.
constexpr double kSmoothing = 0.5;
double Smooth(const std::optional<double>& old, double x) {
  return old ? kSmoothing * *old + (1 - kSmoothing) * x : x;
}
}  // namespace

IntervalPolicy::IntervalPolicy(IntervalMode mode, std::uint64_t every_steps, double every_seconds, double mtbf_seconds,
                               double start_seconds)
    : mode_(mode),
      every_steps_(std::max<std::uint64_t>(every_steps, 1)),
      every_seconds_(every_seconds),
      mtbf_seconds_(mtbf_seconds),
      last_save_seconds_(start_seconds) {}

bool IntervalPolicy::Due(std::int64_t step, double now_seconds) const {
  if (last_step_ && *last_step_ == step) return false;
  if (mode_ == IntervalMode::kSteps) return step >= 0 && static_cast<std::uint64_t>(step) % every_steps_ == 0;
  return now_seconds - last_save_seconds_ >= interval_seconds();
}

void IntervalPolicy::OnSaveStarted(std::int64_t step, double now_seconds) {
  last_step_ = step;
  last_save_seconds_ = now_seconds;
}

void IntervalPolicy::OnCostMeasured(double stall_seconds, double persist_seconds) {
  stall_ = Smooth(stall_, stall_seconds);
  persist_ = Smooth(persist_, persist_seconds);
}

double IntervalPolicy::interval_seconds() const {
  switch (mode_) {
    case IntervalMode::kSteps:
      return 0;
    case IntervalMode::kSeconds:
      return every_seconds_;
    case IntervalMode::kAuto:
      if (!stall_) return every_seconds_;
      // Young/Daly; never more often than a persist can complete, or saves
      // would queue behind one another.
      return std::max(std::sqrt(2 * *stall_ * mtbf_seconds_), *persist_);
  }
  return every_seconds_;
}

double IntervalPolicy::expected_overhead() const {
  const double t = interval_seconds();
  if (!stall_ || t <= 0 || mtbf_seconds_ <= 0) return 0;
  return *stall_ / t + (t / 2 + *persist_) / mtbf_seconds_;
}

}  // namespace stoker
