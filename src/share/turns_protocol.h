// The messages between a process under the interposer and the node agent's
// compute schedule (turns_broker.h, brokered_turns.h): one fixed-size
// request and one reply per call, over a SOCK_SEQPACKET Unix socket, so a
// message arrives whole or not at all. Both ends come from one stoker
// build; a version mismatch is refused with a message naming both.
//
// Who asks is the kernel's word (SO_PEERCRED), never the message's: a
// tenant's name in the schedule is "<tenant>@uid<uid>" with the caller's
// uid, or the bare name when the caller passes (SCM_RIGHTS) the pinned
// limits file the device plugin wrote for that tenant. No process can act
// for another user's tenant, or write the schedule itself.
//
// Plain C++ and the C library: this runs inside the interposer.
#pragma once

#include <cstdint>

#include "share/ledger.h"

namespace stoker::share {

inline constexpr std::uint32_t kTurnsProtocolVersion = 1;

enum class TurnsOp : std::uint32_t {
  kHello = 1,   // tenant, a: compute share, a descriptor may come along -> value: tenant index
  kDevice,      // uuid, a: physical bytes -> value: device index
  kSetShare,    // device, a: share
  kAcquire,     // device, a: now, b: period, flag: work conserving -> ok: acquired, a: until (else: budget wait)
  kRelease,     // device, a: now, b: period, flag: work running
  kExtend,      // device, a: now, b: period, flag: work conserving -> ok: extended, a: until
  kBudgetWait,  // device, a: now, b: period -> a: ns
  kWaited,      // a: now -> a: ns
  kOverrun,     // device, a: released, b: done, c: waited at release, d: period
};

struct TurnsRequest {
  std::uint32_t version;
  std::uint32_t op;
  std::int32_t device;
  std::uint32_t flag;
  std::uint64_t a, b, c, d;
  std::uint8_t uuid[16];
  char tenant[kTenantNameBytes];  // NUL-terminated
};

struct TurnsReply {
  std::uint32_t version;
  std::uint32_t ok;
  std::int32_t value;
  std::uint32_t reserved;
  std::uint64_t a;
  char error[256];  // NUL-terminated, when !ok for kHello, kDevice, kSetShare
};

}  // namespace stoker::share
