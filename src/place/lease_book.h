// The node's leases: which cards each running command was given. JSON
// files (docs/gpu-sharing.md, "The lease file"), read whole and rewritten
// whole under an exclusive flock; the kernel drops that lock when its
// holder dies, and a file is replaced by rename, so a crash at any
// instruction leaves the old leases or the new ones. A lease whose process
// (checked with its start time, against pid reuse) and tenant's processes
// in the ledger have all ended is reclaimed by the next reader.
//
// Two layouts:
//  - one file named by hand (--leases, STOKER_GPU_LEASES), locked by
//    "<file>.lock": every user of it must be able to write it;
//  - in the GPU state folder, one file per user, leases-uid<uid>.json,
//    locked together by "leases.lock" there: each user reads everyone's
//    leases to choose cards and writes only their own, so no user can
//    drop another's lease or is refused because another came first.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/unique_fd.h"
#include "stoker/gpu_place.h"

namespace stoker::place {

inline constexpr char kLeaseFormat[] = "stoker-gpu-leases";
inline constexpr int kLeaseVersion = 1;

// The text <-> leases. Parse errors are Corruption naming `path`, the
// lease and the field.
[[nodiscard]] Result<std::vector<GpuLease>> ParseLeases(std::string_view text, const std::string& path);
[[nodiscard]] std::string SerializeLeases(const std::vector<GpuLease>& leases);

// The start time of `pid` (clock ticks since boot, /proc/<pid>/stat), 0 if
// it is not running.
[[nodiscard]] std::uint64_t ProcessStartTime(int pid);

// The ledgers that leases name, each read once per look at the node (a
// read also frees dead processes' slots): which tenants have live
// processes, and what each tenant is charged on each card.
class LedgerViews {
 public:
  [[nodiscard]] bool TenantLive(const std::string& ledger, const std::string& tenant);
  [[nodiscard]] std::uint64_t Charged(const std::string& ledger, const std::string& tenant, const std::string& uuid);

 private:
  struct View {
    std::set<std::string> live;
    std::map<std::pair<std::string, std::string>, std::uint64_t> charged;  // (tenant, uuid)
  };
  const View& Get(const std::string& ledger);
  std::map<std::string, View> views_;
};

class LeaseBook {
 public:
  // Takes the lock (waiting up to `wait_seconds` for another holder) and
  // reads the leases; a missing file is no leases.
  [[nodiscard]] static Result<LeaseBook> Open(const std::string& path, double wait_seconds = 30);

  // Whether `path` is a user's file in the per-user layout.
  [[nodiscard]] static bool PerUser(const std::string& path);

  [[nodiscard]] std::vector<GpuLease>& leases() { return leases_; }
  // Drops the leases nobody uses any more; returns how many.
  int ReclaimDead(LedgerViews& ledgers);
  // Writes the leases back (atomically): this user's only, in the per-user
  // layout. The lock stays held.
  [[nodiscard]] Status Save();
  // Whether lease `id` was read from another user's file (Save leaves it).
  [[nodiscard]] bool Foreign(const std::string& id) const { return foreign_.count(id) > 0; }
  [[nodiscard]] const std::string& path() const { return path_; }

 private:
  LeaseBook(std::string path, UniqueFd lock) : path_(std::move(path)), lock_(std::move(lock)) {}
  std::string path_;
  UniqueFd lock_;
  std::vector<GpuLease> leases_;
  std::set<std::string> foreign_;  // ids of other users' leases
};

}  // namespace stoker::place
