// GPU sharing: holding processes to a memory quota and a compute share on
// shared GPUs (docs/gpu-sharing.md). The interposer, libstoker-share.so, is
// preloaded into a command's processes and enforces what the environment
// below says; these functions prepare that environment, check a program
// can be held, and read the node's ledger. `stoker gpu run` and
// `stoker gpu ls` are built on them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "stoker/status.h"

namespace stoker {

struct GpuShareSettings {
  std::optional<std::uint64_t> memory_limit;             // bytes, on every visible device
  std::map<std::uint32_t, std::uint64_t> device_memory;  // bytes by CUDA ordinal (overrides)
  std::optional<std::uint32_t> compute_share;            // percent of each device's time, 1-100
  std::string tenant;  // processes sharing one quota; empty: "run-<pid>" of the caller
  std::string ledger;  // the memory ledger; empty: DefaultGpuLedgerPath()
};

// The variables to set (LD_PRELOAD first, then STOKER_GPU_*) for a command
// held to `settings` by the interposer at `interposer`; an existing
// LD_PRELOAD (`current_preload`, may be null) is kept after it. Bad values
// are an InvalidArgument naming the setting. Where an MPS server runs
// (MpsRunning()), a compute share is applied by MPS
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) instead of the interposer's turns.
[[nodiscard]] Result<std::vector<std::pair<std::string, std::string>>> GpuShareEnvironment(
    const GpuShareSettings& settings, const std::string& interposer, const char* current_preload);

// Whether an NVIDIA MPS control daemon is reachable ($CUDA_MPS_PIPE_DIRECTORY,
// else /tmp/nvidia-mps, holds its control pipe).
[[nodiscard]] bool MpsRunning();

// The interposer library: $STOKER_GPU_INTERPOSER, else libstoker-share.so
// in lib/ beside (or above) the running program, else in the Python
// package's folder. NotFound names every place looked at.
[[nodiscard]] Result<std::string> FindGpuInterposer();

// The program `command` (a path, or a name looked up on PATH) as it will
// run, checked to load a preloaded library: a statically linked program,
// a set-user-ID or set-group-ID one, or one with file capabilities would
// run unlimited, and is refused (FailedPrecondition, saying why); a script
// is checked by its interpreter. Returns the resolved path.
[[nodiscard]] Result<std::string> CheckPreloadable(const std::string& command);

// The node's GPU state folder: $STOKER_GPU_DIR, else /dev/shm/stoker-gpu
// (made sticky and world-writable when missing, like /tmp): every user's
// memory ledger, the compute schedule and every user's leases.
[[nodiscard]] std::string GpuStateDir();

// Where an operator pins limits that apply whatever a process's
// environment says (docs/gpu-sharing.md, "Pinned limits"):
// /etc/stoker/gpu-limits. Whether it exists here.
[[nodiscard]] const char* PinnedGpuLimitsPath();
[[nodiscard]] bool PinnedGpuLimitsPresent();

// This user's memory ledger: $STOKER_GPU_LEDGER, else ledger-uid<uid> in the
// node's GPU state folder ($STOKER_GPU_DIR, else /dev/shm/stoker-gpu).
[[nodiscard]] std::string DefaultGpuLedgerPath();

// How long a process may hold the ledger's lock before the others fence it
// out (a stopped or frozen holder; docs/gpu-sharing.md, "The ledger").
inline constexpr int kGpuLedgerLockBoundMs = 500;

// What the node's ledgers hold, as `stoker gpu ls` shows it (dead
// processes' slots are freed while reading): the ledger at `path`; else,
// with STOKER_GPU_LEDGER unset, every user's ledger in the state folder
// that this user may read (all of them for root), the others listed as
// unreadable. An absent ledger is an empty report.
struct GpuLedgerView {
  struct Device {
    std::string uuid;
    std::uint64_t physical_bytes = 0;
    std::uint64_t stuck_takeovers = 0;  // compute turns taken from a holder that never gave them back
    std::uint64_t turns_granted = 0;    // compute turns granted on it (how often it changed hands)
  };
  struct Process {
    int pid = 0;
    std::vector<std::uint64_t> charged;  // per device
    std::uint64_t oom_refusals = 0, throttled_ns = 0, launches = 0, started_unix = 0;
  };
  struct Tenant {
    std::string name;
    unsigned owner_uid = 0;                           // the user whose ledger holds it
    std::vector<std::optional<std::uint64_t>> quota;  // per device; nullopt: none
    std::vector<std::uint64_t> charged;               // per device
    std::uint32_t compute_share = 0;                  // 0: none
    std::vector<std::uint32_t> compute_shares;        // per device (differs by card in a per-card grant); 0: none
    std::vector<Process> processes;
  };
  std::string path;  // the ledger, or the state folder whose ledgers were read
  std::vector<Device> devices;
  std::vector<Tenant> tenants;
  std::vector<std::string> unreadable;  // other users' ledgers this user may not read
  std::uint64_t repairs = 0;            // times the ledger's lock was taken over and the ledger rebuilt
  std::uint64_t fences = 0;             // of those, holders fenced out (stopped or frozen while holding it)
};
[[nodiscard]] Result<GpuLedgerView> ReadGpuLedger(const std::string& path = "");

// What `stoker gpu agent` makes of a node's state folder `dir` (empty:
// GpuStateDir()), as root: the folder root's, sticky and world-writable
// (so that no user can squat it before anyone needs it), and the compute
// schedule `turns` root's and read-only to users (the agent's turns broker
// writes it; processes with a compute share wait for the broker). What it
// changed, one line each; an error for a symbolic link or another kind of
// file where the folder should be.
[[nodiscard]] Result<std::vector<std::string>> PrepareGpuStateDir(const std::string& dir = "");

// The node's compute schedule kept by its agent (docs/gpu-sharing.md,
// "Turns between users"): serves processes under the interposer over a
// Unix socket until destroyed. Only the agent writes the schedule; each
// process acts for its own tenant only, named with its uid (the kernel's
// word), or by its bare name when it passes the pinned limits file the
// device plugin wrote for that tenant under `limits_dir`.
struct GpuTurnsBrokerOptions {
  std::string turns_path;                       // made root's, 0644
  std::string socket_path;                      // made 0666
  std::string limits_dir;                       // "<limits_dir>/<tenant>.compute"; empty: names always carry the uid
  std::function<void(const std::string&)> log;  // refusals and the like, a line each
};
class GpuTurnsBroker {
 public:
  virtual ~GpuTurnsBroker() = default;
  // Processes served now.
  [[nodiscard]] virtual std::size_t clients() const = 0;
};
[[nodiscard]] Result<std::unique_ptr<GpuTurnsBroker>> StartGpuTurnsBroker(const GpuTurnsBrokerOptions& options);

// Whether process `pid` (as this process sees PIDs) runs under the GPU
// interposer: it holds a stoker ledger open (found through /proc/<pid>/fd,
// whatever folder or mount namespace the ledger is in). nullopt when that
// cannot be told (another user's process without root, or one that ended).
[[nodiscard]] std::optional<bool> UnderGpuInterposer(int pid);

// For the node's agent (root, in the node's PID namespace): tells each of
// `pids` (processes using a GPU, as NVML lists them) that runs in a PID
// namespace of its own (a container) its PID here, through the ledgers it
// holds open, so that its interposer finds itself in NVML's per-process
// list (memory the driver holds for it beyond its allocations is then
// charged). Returns how many ledger slots were told.
std::size_t RecordGpuHostPids(const std::vector<int>& pids);

}  // namespace stoker
