// A std::mutex that clang's thread-safety analysis understands, its scoped
// lock, and a condition variable that waits on it.
#pragma once

#include <condition_variable>
#include <mutex>

#include "core/thread_annotations.h"

namespace stoker {

class CAPABILITY("mutex") Mutex {
 public:
  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : mu_(mu) { mu_.Lock(); }
  ~MutexLock() RELEASE() { mu_.Unlock(); }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

 private:
  Mutex& mu_;
};

class CondVar {
 public:
  // Waits until `ready()` holds; `mu` must be held and is held again on return.
  template <typename Predicate>
  void Wait(Mutex& mu, Predicate ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    cv_.wait(lock, ready);
    lock.release();  // still held; ownership stays with the caller's MutexLock
  }
  // Waits until `ready()` holds or `timeout` passes; returns ready().
  template <typename Duration, typename Predicate>
  bool WaitFor(Mutex& mu, Duration timeout, Predicate ready) REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu.mu_, std::adopt_lock);
    const bool result = cv_.wait_for(lock, timeout, ready);
    lock.release();
    return result;
  }
  void NotifyAll() { cv_.notify_all(); }
  void NotifyOne() { cv_.notify_one(); }

 private:
  std::condition_variable cv_;
};

}  // namespace stoker
