// The ledger's lock: a futex word in the shared file, owned by a process's
// slot, that no process can hold hostage.
//
// A robust pthread mutex survives a holder that dies, but not one that
// stops (SIGSTOP, a cgroup freezer, a debugger): every GPU process of the
// node would wait on it forever. Here a waiter gives up on a holder in two
// cases and takes the lock over:
//  - the holder is dead (its slot's file lock is gone: `alive` says so);
//  - the holder has held the very same acquisition for longer than the
//    bound (critical sections take microseconds): it is fenced out.
// Either way the new holder is told to repair: the ledger's tenant totals
// are rebuilt from the slots, which only their own process writes. A fenced
// holder that wakes up finishes its critical section unaware; its unlock
// then finds the lock taken over, does not release it, and flags a repair
// for the next holder, so what it wrote meanwhile is rebuilt too.
//
// The word carries the holder's slot (low 16 bits, slot + 1; 0: free) and a
// generation bumped by every acquisition (high 16 bits), so an unlock or a
// fence never mistakes a later acquisition for the one it saw.
//
// No exceptions, no allocation: this runs inside the interposer.
#pragma once

#include <cstdint>

namespace stoker::share {

struct LedgerLockWord {
  std::uint32_t word;          // (generation << 16) | (slot + 1), or generation << 16 when free
  std::uint32_t waiters;       // processes in the slow path
  std::uint32_t needs_repair;  // set by a fenced holder's unlock
  std::uint32_t reserved;
  std::uint64_t fences;  // holders fenced out after the bound
  std::uint64_t deaths;  // holders found dead
};

enum class LockTaken {
  kClean,   // as the last holder left it
  kRepair,  // the last holder died, was fenced out, or flagged a repair
};

// `owner` is this process's slot + 1 (1..65535). `alive(owner)` says
// whether the holder `owner` still lives. `bound_ns`: how long one
// acquisition may be held before waiters fence it out.
using OwnerAlive = bool (*)(const void* context, std::uint32_t owner);
[[nodiscard]] LockTaken LockLedger(LedgerLockWord* lock, std::uint32_t owner, std::uint64_t bound_ns, OwnerAlive alive,
                                   const void* context, std::uint32_t* held_word);
// Releases the acquisition `held_word` (what LockLedger returned). False
// when it had been fenced out (the lock is not released; a repair is flagged).
bool UnlockLedger(LedgerLockWord* lock, std::uint32_t held_word);

// The owner (slot + 1) in a word; 0: free.
inline std::uint32_t LockOwner(std::uint32_t word) {
  return word & 0xffffu;
}

}  // namespace stoker::share
