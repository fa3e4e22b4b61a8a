#include "device/batch_stager.h"

#include <fmt/format.h>

namespace stoker::device {
namespace {

// How long the thread waits for the host loader before looking for a stop
// or pause again.
constexpr auto kSlice = std::chrono::milliseconds(50);

bool HoldsBuffer(const BatchStager::Item& item) {
  return item.ok() && item->has_value();
}

}  // namespace

BatchStager::BatchStager(Hooks hooks, std::uint32_t buffers) : hooks_(std::move(hooks)), buffers_(buffers) {
  thread_ = std::thread([this] { Run(); });
}

BatchStager::~BatchStager() {
  {
    MutexLock lock(mu_);
    stop_ = true;
    cv_.NotifyAll();
  }
  thread_.join();
}

bool BatchStager::CanStage() const {
  return !paused_ && !halted_ && staged_batches_ + held_ < buffers_;
}

void BatchStager::Run() {
  if (hooks_.start) {
    if (Status s = hooks_.start(); !s.ok()) {
      MutexLock lock(mu_);
      staged_.push_back(s);
      halted_ = true;
      cv_.NotifyAll();
    }
  }
  for (;;) {
    {
      MutexLock lock(mu_);
      cv_.Wait(mu_, [this]() REQUIRES(mu_) { return stop_ || CanStage(); });
      if (stop_) return;
      producing_ = true;
    }
    Item item = hooks_.produce(kSlice);
    MutexLock lock(mu_);
    producing_ = false;
    if (item.ok() || item.error().code() != StatusCode::kDeadlineExceeded) {
      if (HoldsBuffer(item)) {
        ++staged_batches_;
      } else {
        halted_ = true;  // the epoch's end or an error: the consumer takes it before anything else is fetched
      }
      staged_.push_back(std::move(item));
    }
    cv_.NotifyAll();
  }
}

BatchStager::Item BatchStager::Take(std::chrono::nanoseconds timeout) {
  MutexLock lock(mu_);
  if (halted_ && staged_.empty()) {
    halted_ = false;  // the end or error before was taken: the consumer asks for the next
    cv_.NotifyAll();
  }
  auto ready = [this]() REQUIRES(mu_) { return !staged_.empty() || (held_ >= buffers_ && !producing_); };
  if (timeout == std::chrono::nanoseconds::max()) {
    cv_.Wait(mu_, ready);
  } else if (!cv_.WaitFor(mu_, timeout, ready)) {
    return Status::DeadlineExceeded("the next batch is not ready yet");
  }
  if (staged_.empty())
    return Status::ResourceExhausted(fmt::format(
        "all {} device buffers are held by the consumer; release batches before asking for more", buffers_));
  Item item = std::move(staged_.front());
  staged_.pop_front();
  if (HoldsBuffer(item)) {
    --staged_batches_;
    ++held_;
  }
  cv_.NotifyAll();
  return item;
}

void BatchStager::Released() {
  MutexLock lock(mu_);
  if (held_ > 0) --held_;
  cv_.NotifyAll();
}

BatchStager::Pending BatchStager::PendingLocked() const {
  Pending p;
  for (const Item& item : staged_) {
    if (item.ok() && !item->has_value()) {
      p.end = true;
    } else {
      ++p.consumed;
    }
  }
  return p;
}

void BatchStager::WhilePaused(bool drop, const std::function<void(const Pending&)>& action) {
  MutexLock lock(mu_);
  paused_ = true;
  cv_.Wait(mu_, [this]() REQUIRES(mu_) { return !producing_; });
  const Pending pending = PendingLocked();
  if (drop) {
    for (const Item& item : staged_)
      if (HoldsBuffer(item)) hooks_.abandon(**item);
    staged_.clear();
    staged_batches_ = 0;
    halted_ = false;
  }
  action(pending);
  paused_ = false;
  cv_.NotifyAll();
}

}  // namespace stoker::device
