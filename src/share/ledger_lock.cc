#include "share/ledger_lock.h"

#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

namespace stoker::share {
namespace {

// How long a waiter sleeps before it looks at the holder again: a dead
// holder wakes nobody.
constexpr std::uint64_t kSliceNs = 2'000'000;

std::uint64_t Now() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Shared between processes: not FUTEX_PRIVATE.
void FutexWait(std::uint32_t* word, std::uint32_t expected, std::uint64_t ns) {
  struct timespec timeout {};
  timeout.tv_sec = static_cast<time_t>(ns / 1'000'000'000ull);
  timeout.tv_nsec = static_cast<long>(ns % 1'000'000'000ull);
  (void)::syscall(SYS_futex, word, FUTEX_WAIT, expected, &timeout, nullptr, 0);
}

void FutexWakeOne(std::uint32_t* word) {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

std::uint32_t Next(std::uint32_t word, std::uint32_t owner) {
  return (((word >> 16) + 1) << 16) | owner;
}

bool TryTake(LedgerLockWord* lock, std::uint32_t seen, std::uint32_t owner, std::uint32_t* held) {
  const std::uint32_t next = Next(seen, owner);
  if (!__atomic_compare_exchange_n(&lock->word, &seen, next, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return false;
  *held = next;
  return true;
}

}  // namespace

LockTaken LockLedger(LedgerLockWord* lock, std::uint32_t owner, std::uint64_t bound_ns, OwnerAlive alive,
                     const void* context, std::uint32_t* held_word) {
  bool repair = false;
  std::uint32_t seen = __atomic_load_n(&lock->word, __ATOMIC_SEQ_CST);
  if (LockOwner(seen) != 0 || !TryTake(lock, seen, owner, held_word)) {
    __atomic_fetch_add(&lock->waiters, 1, __ATOMIC_SEQ_CST);
    std::uint32_t watched = 0;  // the acquisition being timed
    std::uint64_t watched_since = 0;
    for (;;) {
      seen = __atomic_load_n(&lock->word, __ATOMIC_SEQ_CST);
      const std::uint32_t holder = LockOwner(seen);
      if (holder == 0) {
        if (TryTake(lock, seen, owner, held_word)) break;
        continue;
      }
      const std::uint64_t now = Now();
      if (seen != watched) {
        watched = seen;
        watched_since = now;
      }
      if (!alive(context, holder)) {
        if (TryTake(lock, seen, owner, held_word)) {
          __atomic_fetch_add(&lock->deaths, 1, __ATOMIC_RELAXED);
          repair = true;
          break;
        }
        continue;
      } else if (now - watched_since >= bound_ns) {
        if (TryTake(lock, seen, owner, held_word)) {
          __atomic_fetch_add(&lock->fences, 1, __ATOMIC_RELAXED);
          repair = true;
          break;
        }
        continue;
      }
      FutexWait(&lock->word, seen, kSliceNs);
    }
    __atomic_fetch_sub(&lock->waiters, 1, __ATOMIC_SEQ_CST);
  }
  if (__atomic_exchange_n(&lock->needs_repair, 0u, __ATOMIC_ACQ_REL) != 0) repair = true;
  return repair ? LockTaken::kRepair : LockTaken::kClean;
}

bool UnlockLedger(LedgerLockWord* lock, std::uint32_t held_word) {
  std::uint32_t expected = held_word;
  const std::uint32_t free_word = held_word & 0xffff0000u;
  if (!__atomic_compare_exchange_n(&lock->word, &expected, free_word, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    // Fenced out while stopped: what this process wrote since is suspect.
    __atomic_store_n(&lock->needs_repair, 1u, __ATOMIC_RELEASE);
    return false;
  }
  if (__atomic_load_n(&lock->waiters, __ATOMIC_SEQ_CST) != 0) FutexWakeOne(&lock->word);
  return true;
}

}  // namespace stoker::share
