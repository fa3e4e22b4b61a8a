// NVML names processes by their PIDs in the node's PID namespace; a process
// in a container knows only its own namespace's PID, so it cannot find
// itself in NVML's list (the interposer's reconciliation with the driver's
// per-process figures). The node's agent, which sees the host's PIDs, tells
// each such process its host PID through the ledgers it holds open.
//
// Plain C++ and the C library (share_core).
#pragma once

#include <cstddef>
#include <vector>

namespace stoker::share {

// The PID that process `pid` (a PID in the caller's namespace) has in its
// own, innermost PID namespace (the last field of NSpid in
// /proc/<pid>/status); -1 when that cannot be read.
int InnermostPid(int pid);

// For each of `pids` (processes using a GPU, as NVML lists them, in the
// caller's namespace) that runs in a PID namespace of its own: records its
// PID on its slot of every stoker ledger it holds open (found through
// /proc/<pid>/fd, whatever the mount namespace). Returns how many slots
// were given a PID. Needs the right to open other users' ledgers (root).
std::size_t RecordHostPids(const std::vector<int>& pids);

}  // namespace stoker::share
