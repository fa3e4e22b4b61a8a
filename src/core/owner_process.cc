#include "core/owner_process.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace stoker::internal {
namespace {

std::atomic<std::uint64_t> fork_generation{0};

void CountForkInChild() {
  fork_generation.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

std::uint64_t ForkGeneration() {
  // Registered on first use, so before any OwnerProcess is made; a child
  // that forked before then starts at 0 as its parent did, and its objects
  // are its own.
  static const bool registered = pthread_atfork(nullptr, nullptr, CountForkInChild) == 0;
  if (!registered) return std::uint64_t{1} << 63 | static_cast<std::uint64_t>(::getpid());  // the system call, then
  return fork_generation.load(std::memory_order_relaxed);
}

}  // namespace stoker::internal
