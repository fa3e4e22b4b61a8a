// The host state of containers that have ended. The device plugin makes,
// for each grant, a tenant folder (tenants/<tenant>/, the container's
// memory ledger) and pinned limits (limits/<tenant>.memory, .compute) in
// its host folder; the kubelet never says when a container ends, so the
// plugin asks it which containers hold devices (the pod-resources API) and
// sweeps the state of the tenants none holds.
#pragma once

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker::kube {

struct TenantSweep {
  std::vector<std::string> removed;  // tenants whose state was removed
  std::vector<std::string> in_use;   // not listed, but a live process holds its ledger: kept
  std::vector<std::string> notes;    // what could not be read or removed (named), kept for the next sweep
};

// Removes the state in `host_dir` of every plugin tenant ("k8s-" and 16 hex
// digits; nothing else there is touched) that is not in `live`, none of
// whose files changed within `grace` (a grant whose container is being
// made may not be listed yet), and whose ledger no live process holds (a
// ledger that cannot be read is removed: the kubelet says its container
// is gone). IOError only when `host_dir` itself cannot be read.
[[nodiscard]] Result<TenantSweep> SweepEndedTenants(const std::string& host_dir, const std::set<std::string>& live,
                                                    std::chrono::seconds grace);

}  // namespace stoker::kube
