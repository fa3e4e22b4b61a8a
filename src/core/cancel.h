// A cancellation flag that deep layers consult without it being passed
// through every call between: a thread names the flag it answers to for a
// scope (the loader's workers name the loader's stop flag), and code far
// below (a read waiting for a remote shard) asks whether it is set.
#pragma once

#include <atomic>

namespace stoker {

class CancelScope {
 public:
  explicit CancelScope(const std::atomic<bool>* flag) : previous_(current_) { current_ = flag; }
  ~CancelScope() { current_ = previous_; }
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

  // Whether the flag this thread answers to, if any, is set.
  [[nodiscard]] static bool Requested() { return current_ != nullptr && current_->load(std::memory_order_acquire); }

 private:
  static inline thread_local const std::atomic<bool>* current_ = nullptr;
  const std::atomic<bool>* previous_;
};

}  // namespace stoker
