// What a process under the GPU interposer is held to, read from its
// environment (set by `stoker gpu run`, or by hand):
//
//   STOKER_GPU_MEMORY_LIMIT=20GiB     every visible device
//   STOKER_GPU_MEMORY_LIMIT_<i>=8GiB  the i-th visible device (CUDA ordinal,
//                                     after CUDA_VISIBLE_DEVICES); overrides
//   STOKER_GPU_COMPUTE_SHARE=30       percent of each device's time, 1-100
//   STOKER_GPU_COMPUTE_SHARE_<i>=50   on the i-th visible device; overrides
//   STOKER_GPU_COMPUTE_SHARES=GPU-<uuid>:30,GPU-<uuid>:50
//                                     per card by UUID (the device plugin's
//                                     grant); an ordinal's setting overrides
//   STOKER_GPU_TENANT=name            processes that share one quota
//   STOKER_GPU_DIR=/dev/shm/stoker-gpu  the node's shared state (below)
//   STOKER_GPU_LEDGER=/path           the memory ledger (else per uid, in
//                                     the state folder)
//   STOKER_GPU_TURNS=/path            the compute schedule (else the
//                                     ledger's file when STOKER_GPU_LEDGER
//                                     is set, or the node's, in the folder)
//   STOKER_GPU_TURNS_TENANT=name      the tenant's name in the compute
//                                     schedule (else "<tenant>@uid<uid>")
//   STOKER_GPU_TURNS_SOCKET=/path     the node agent's socket for turns
//                                     (else turns.sock in the state folder,
//                                     used when the agent keeps `turns`)
//   STOKER_GPU_COMPUTE_MODE=turns|mps how the share is applied
//   STOKER_GPU_COMPUTE_STRICT=1       the share caps even an idle device
//
// The state folder (sticky and world-writable, like /tmp, when a process
// makes it; `stoker gpu agent` makes it for a node) holds one memory ledger
// per user, ledger-uid<uid> (mode 0600, refused when another user owns it:
// no user can read or change another's quotas and charges, and none is
// refused because another came first), and the node's compute schedule,
// turns. Where the agent runs, turns is root's and read-only to users, who
// ask the agent for turns over turns.sock (turns_broker.h); elsewhere (one
// user's machine) processes make it 0666 and write it themselves.
//
// Plain C++ and the C library only: this code also runs inside the
// interposer, loaded into users' processes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace stoker::share {

inline constexpr char kDefaultStateDir[] = "/dev/shm/stoker-gpu";
inline constexpr std::uint32_t kMaxOrdinals = 64;

struct ShareConfig {
  std::string tenant;        // empty: "uid-<uid>"
  std::string turns_tenant;  // in the compute schedule: STOKER_GPU_TURNS_TENANT, else "<tenant>@uid<uid>"
  std::string state_dir;     // STOKER_GPU_DIR, else kDefaultStateDir
  std::string ledger_path;   // STOKER_GPU_LEDGER, else <state_dir>/ledger-uid<uid>
  std::string turns_path;    // STOKER_GPU_TURNS, else the ledger's path or <state_dir>/turns
  // The node agent's socket: STOKER_GPU_TURNS_SOCKET (then always used),
  // else <state_dir>/turns.sock (used when the agent keeps turns_path).
  std::string turns_socket;
  bool turns_socket_named = false;  // by STOKER_GPU_TURNS_SOCKET
  // The name this process gives the agent: STOKER_GPU_TURNS_TENANT, else
  // the tenant (the agent adds the caller's uid unless a pinned limits file
  // vouches for the name).
  std::string broker_tenant;
  // The ledger is this user's in the state folder (made there if missing,
  // and refused when another user owns it).
  bool ledger_in_state_dir = false;
  bool turns_in_state_dir = false;
  // Bytes per CUDA ordinal; kNoLimit where none applies.
  static constexpr std::uint64_t kNoLimit = ~std::uint64_t{0};
  std::uint64_t default_limit = kNoLimit;
  std::vector<std::pair<std::uint32_t, std::uint64_t>> ordinal_limits;
  std::uint32_t compute_share = 0;  // 0: none
  // Per device: by CUDA ordinal, and by card UUID ("GPU-...", as NVML and
  // `stoker gpu ls` write it). The most specific setting applies.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ordinal_shares;
  std::vector<std::pair<std::string, std::uint32_t>> card_shares;
  // Under pinned limits (pinned_limits.h): the environment's own shares,
  // which may lower the pinned ones on a device, never raise them.
  std::uint32_t env_compute_share = 0;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> env_ordinal_shares;
  std::vector<std::pair<std::string, std::uint32_t>> env_card_shares;
  std::uint32_t compute_period_ms = 100;
  // STOKER_GPU_COMPUTE_MODE=mps: the MPS server holds the process to its
  // share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, set by `stoker gpu run`), and
  // the interposer's turns stay off; "turns" (the default) otherwise.
  bool compute_by_mps = false;
  // STOKER_GPU_COMPUTE_STRICT=1: held to the share even when no other
  // tenant wants the device (by default an idle device is lent).
  bool compute_strict = false;
  // The pinned limits file that applied on top of the environment
  // (pinned_limits.h), or empty.
  std::string pinned_from;

  [[nodiscard]] std::uint64_t LimitFor(std::uint32_t ordinal) const;
  // The compute share (percent) on the device at `ordinal` whose UUID is
  // `uuid`; 0: none (its launches are not held to turns).
  [[nodiscard]] std::uint32_t ShareFor(std::uint32_t ordinal, const std::string& uuid) const;
  // Whether any device has a compute share.
  [[nodiscard]] bool HasComputeShare() const;
};

// Reads the configuration through `get` (getenv in the interposer). False
// with `*error` naming the variable and what is wrong with its value.
bool ParseShareConfig(const std::function<const char*(const char*)>& get, ShareConfig* config, std::string* error);

// The memory ledger of user `uid` in state folder `dir`.
std::string UserLedgerPath(const std::string& dir, unsigned uid);

// The tenant name rule: 1-63 characters of [A-Za-z0-9._-].
bool ValidTenantName(const std::string& name);

}  // namespace stoker::share
