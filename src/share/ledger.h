// A GPU ledger: what every tenant may use of every GPU, and what each of
// its processes holds, in one shared-memory file that every process of every
// tenant maps (one per user in the state folder, share_config.h, or one
// named by STOKER_GPU_LEDGER; the compute schedule uses the same format).
// docs/gpu-sharing.md specifies the layout; it is versioned like the index.
//
// Admission is one critical section under the ledger's lock (ledger_lock.h):
// the tenant's charge on the device plus the request must fit its quota,
// and then the process's slot and the tenant are charged together. If the
// allocation then fails, the charge is taken back. A process that dies,
// even SIGKILLed while holding the lock, or that stops holding it, leaves a
// consistent ledger and no process waiting on it for long:
//  - each process owns an open-file-description lock on its slot's byte of
//    the file from Open until it closes the ledger; the kernel drops it when
//    the process dies (at any instruction), so a slot whose byte nobody
//    locks is a dead process's, and pid reuse cannot fool it;
//  - a dead slot's charge is taken off its tenant when anyone next needs
//    room (or lists the ledger), and its slot is freed;
//  - the lock is owned by a slot: a holder found dead, or holding one
//    acquisition past the bound (stopped, frozen), is taken over, and the
//    new holder recomputes every tenant's charge from the slots (each slot
//    is written only by its own process).
//
// C++ without exceptions and without stoker's formatting library: this
// code also runs inside the interposer, loaded into users' processes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "share/ledger_lock.h"
#include "share/turn_schedule.h"

namespace stoker::share {

inline constexpr char kLedgerMagic[8] = {'S', 'T', 'K', 'L', 'E', 'D', 'G', 'R'};
inline constexpr std::uint32_t kLedgerVersion = 6;
inline constexpr std::uint32_t kMaxDevices = 16;
// A node's tenants: a Kubernetes node hands out one per memory unit (8
// cards of 141 GiB at 1 GiB units: 1,128), each with its processes.
inline constexpr std::uint32_t kMaxTenants = 2048;
inline constexpr std::uint32_t kMaxSlots = 4096;  // below 65535: the lock word holds slot + 1
// How long one holder may keep the ledger's lock before waiters fence it
// out (critical sections take microseconds).
inline constexpr std::uint64_t kLockBoundNs = 500'000'000;
inline constexpr std::size_t kTenantNameBytes = 80;  // NUL-terminated: a name and "@uid<uid>"
inline constexpr std::uint64_t kNoQuota = ~std::uint64_t{0};
// Code images whose load was measured (Ledger::CodeBytes).
inline constexpr std::uint32_t kMaxCodeSizes = 1024;

// The layout, byte for byte (little-endian, no pointers; docs/gpu-sharing.md).
struct LedgerHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t max_devices, max_tenants, max_slots;
  std::uint64_t layout_bytes;
  std::uint64_t repairs;  // recomputations after a holder died
  // When dead processes' slots were last swept (CLOCK_MONOTONIC; 0: never).
  std::uint64_t swept_ns;
  alignas(64) LedgerLockWord lock;
};
struct LedgerDevice {
  std::uint8_t uuid[16];
  std::uint64_t physical_bytes;
  std::uint32_t in_use;
  // The compute schedule: the tenant (plus one) whose processes may launch
  // work now, or 0; read without the lock by the holder's launches.
  std::uint32_t holder;
  std::uint32_t borrowed;         // a turn on an otherwise idle device: not charged
  std::uint64_t hold_started_ns;  // CLOCK_MONOTONIC
  std::uint64_t hold_until_ns;
  std::uint64_t stuck_takeovers;  // turns taken from a holder past StuckAfter
  // Overruns (work of a turn that ran on after it was given back), as the
  // device runs queued work in order: the last one charged (released, done)
  // so that an overrun queued behind it counts from when it ended; and the
  // turn granted after the newest release with work running (tenant + 1,
  // from, until; 0 while held), whose time that work took is refunded.
  std::uint64_t overrun_released_ns, overrun_done_ns;
  std::uint64_t running_since_ns;  // the newest release with work running
  std::uint32_t next_tenant, reserved2;
  std::uint64_t next_from_ns, next_until_ns;
  // What a context took on it when last measured: a new context is
  // admitted against the quota for that much before it is made.
  std::uint64_t context_bytes;
  // When a tenant with a share on it last asked for it, held it or gave it
  // back (0: never): while that is within a period, the processes of
  // tenants without a share take turns on it too (SharesWant).
  std::uint64_t shares_wanted_ns;
  // Turns granted on it: how often it changed hands (each change costs a
  // drain and the next holder's wake-up).
  std::uint64_t turns_granted;
};
struct LedgerTenant {
  char name[kTenantNameBytes];
  std::uint64_t quota[kMaxDevices];    // kNoQuota: unlimited on that device
  std::uint64_t charged[kMaxDevices];  // the sum of its live slots' charges
  std::uint32_t compute_share;         // percent of the GPU's time; 0: none set
  std::uint32_t in_use;
  // The devices its processes launch on (bit d): a turn is granted on all
  // of them at once, or not at all, so that two tenants spread over the
  // same cards never hold one card each while waiting for the other's.
  std::uint32_t devices_used;
  std::uint32_t strict;  // held to its share even on an idle device (no borrowed turns)
  // When its processes last asked for or gave back each device: a tenant
  // that did within a period still wants it, so none is lent over it.
  std::uint64_t last_want_ns[kMaxDevices];
  // Devices where work of a turn it gave back still runs (bit d): it still
  // uses them, so none is lent over it.
  std::uint32_t running;
  std::uint32_t reserved;
  // Time some process of it spent waiting for a turn, on any device (ns;
  // the wait under way, since waiting_since_ns, on the devices of
  // waiting_on, included): work of its that ran on past a turn may have
  // waited for its own next turn (a collective whose peer, on another
  // card, could not launch), which is not the device's time.
  std::uint64_t waited_ns;
  std::uint64_t waiting_since_ns;
  std::uint32_t waiting_on;
  std::uint32_t reserved3;
  // Device time it may still use (ns; negative after an overrun), and when
  // it was last topped up at compute_share percent of the time passed.
  std::int64_t budget_ns[kMaxDevices];
  std::uint64_t budget_at_ns[kMaxDevices];
  // Its share on each device where it differs from compute_share (a grant
  // of different parts of several cards); 0: compute_share applies.
  std::uint32_t device_share[kMaxDevices];
};
struct LedgerSlot {
  std::int32_t pid;
  std::uint32_t tenant;
  std::uint32_t in_use;
  std::uint32_t waiting;  // devices (bit d) it waits to launch on
  std::uint64_t charged[kMaxDevices];
  std::uint64_t oom_refusals;  // allocations refused over the quota
  std::uint64_t throttled_ns;  // launches held back for the compute share
  std::uint64_t launches;
  std::uint64_t started_unix;
  // Its PID in the node's PID namespace, where it runs in a namespace of
  // its own (a container): NVML lists host PIDs. Written by the node's
  // agent (RecordHostPid); 0 until then.
  std::int32_t host_pid;
  std::uint32_t reserved;
};
// What loading a module or library of the same code took on a device
// when last measured (code_image.h's key, mixed with the device), so the
// next load is admitted before the driver makes it (version 4).
struct LedgerCodeSize {
  std::uint64_t key;  // 0: free
  std::uint64_t bytes;
  std::uint64_t used_unix;  // the least recently used goes when the table is full
};
struct LedgerLayout {
  LedgerHeader header;
  LedgerDevice devices[kMaxDevices];
  LedgerTenant tenants[kMaxTenants];
  LedgerSlot slots[kMaxSlots];
  LedgerCodeSize code_sizes[kMaxCodeSizes];
};

// What `stoker gpu ls` shows.
struct LedgerReport {
  struct Device {
    std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
    std::uint64_t physical_bytes = 0;
    std::uint64_t stuck_takeovers = 0;  // compute turns taken from a holder that never gave them back
    std::uint64_t turns_granted = 0;    // compute turns granted on it
  };
  struct Process {
    int pid = 0;
    std::vector<std::uint64_t> charged;  // per device
    std::uint64_t oom_refusals = 0, throttled_ns = 0, launches = 0, started_unix = 0;
  };
  struct Tenant {
    std::string name;
    std::vector<std::uint64_t> quota, charged;  // per device; kNoQuota: none
    std::uint32_t compute_share = 0;
    std::vector<std::uint32_t> compute_shares;  // per device: its share there (0: none)
    std::vector<Process> processes;
  };
  std::vector<Device> devices;
  std::vector<Tenant> tenants;
  std::uint64_t reclaimed_slots = 0;  // dead processes' slots freed while reading
  std::uint64_t repairs = 0;          // times the lock was taken over and the ledger rebuilt
  std::uint64_t fences = 0;           // holders fenced out after holding the lock too long
};

std::string FormatUuid(const std::uint8_t uuid[16]);

// How a ledger's file is made and trusted.
struct LedgerFile {
  unsigned mode = 0600;   // when created (umask does not apply)
  bool make_dir = false;  // make the folder if missing: sticky, world-writable, like /tmp
  bool must_own = false;  // refuse a file another user owns (a user's own ledger)
};

class Ledger final : public TurnSchedule {
 public:
  // Opens the ledger at `path`, creating it if missing, and claims a
  // process slot (held until the ledger is closed or the process ends).
  // Empty on failure, with `*error` saying why (another version, not a
  // ledger, permissions, another user's file, no free slot).
  static Ledger* Open(const std::string& path, std::string* error, const LedgerFile& file = {});
  // The same for a ledger the caller opened read-write (`fd`, taken over
  // whatever happens), named `name` in messages: one reached through
  // another process's /proc/<pid>/fd.
  static Ledger* OpenDescriptor(int fd, const std::string& name, std::string* error);
  ~Ledger() override;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Registers this process's slot under `tenant` (created if new, with
  // `compute_share`). False with `*error` when the tenant table is full or
  // the tenant's share disagrees with another of its processes.
  // `pid`: the process the slot stands for, when not this one (the node
  // agent holds a slot of the compute schedule for each process it serves).
  bool Register(std::string_view tenant, std::uint32_t compute_share, std::string* error, std::int32_t pid = 0);
  // The tenant's index in the table (valid once registered).
  [[nodiscard]] std::uint32_t tenant_index() const { return tenant_; }
  // Gives the slot back (normal exit); its charges leave the tenant.
  void Unregister() override;
  // After fork, in the child, at once (async-signal-safe: munmap, close):
  // drops the child's references to the parent's file description, whose
  // slot lock would otherwise keep a killed parent's slot and charge alive
  // for as long as the child lives. The ledger is unusable until
  // ReopenAfterFork.
  void DetachAfterFork() override;
  // Then, when the child first needs the ledger: opens the file anew and
  // takes a slot of its own under the parent's tenant.
  bool ReopenAfterFork(std::string* error) override;

  // The device entry for `uuid` (added if new). -1 when the table is full.
  int Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) override;
  // Sets this tenant's quota on device `d`, or checks it equals one set by
  // another of its processes. kNoQuota: none.
  bool SetQuota(int d, std::uint64_t quota, std::string* error);
  // Sets this tenant's compute share on device `d` (percent; 0: the
  // registered share applies), or checks it equals one another of its
  // processes set.
  bool SetComputeShare(int d, std::uint32_t share, std::string* error) override;

  // Admission: charges `bytes` on device `d` to this process and tenant,
  // or returns false (and counts a refusal) when that would pass the
  // quota, after taking dead processes' charges back.
  bool Charge(int d, std::uint64_t bytes, bool count_refusal = true);
  // Charges without admission (memory the driver already gave, such as a
  // measured context, or a pool that grew): the tenant may end up over.
  void ForceCharge(int d, std::uint64_t bytes);
  void Uncharge(int d, std::uint64_t bytes);
  // Turns a reservation of `reserved` bytes into `actual` (what the driver
  // took), without admission: pools and arrays learn their size after the
  // call.
  void Settle(int d, std::uint64_t reserved, std::uint64_t actual);
  // What a context took on device `d` when last measured (0: never), and
  // recording a measurement (no lock: one word).
  [[nodiscard]] std::uint64_t ContextBytes(int d) const;
  void LearnContextBytes(int d, std::uint64_t bytes);
  // What loading the code keyed `key` (code_image.h) took on device `d`
  // when last measured (0: never), and recording a measurement.
  [[nodiscard]] std::uint64_t CodeBytes(int d, std::uint64_t key);
  void LearnCodeBytes(int d, std::uint64_t key, std::uint64_t bytes);

  // The compute schedule (tenants with a compute share): one tenant at a
  // time launches on a device, for at most its share of each `period_ns`;
  // its time on the device is charged against a budget that grows at its
  // share of wall time, so overruns are paid back. A tenant's turn covers
  // every device its processes use, granted together or not at all: no
  // circular wait between tenants spread over the same cards (NCCL jobs).
  // Acquire: true (and `*until`) when this process's tenant holds device
  // `d` now, taking its devices if free and its budget allows; false: it
  // waits (marked). With `work_conserving`, a tenant out of budget still
  // gets short, uncharged turns while no other tenant waits for its devices.
  bool AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns,
                     bool work_conserving = false) override;
  // Whether this process's tenant holds `d` (no lock: the fast path).
  [[nodiscard]] bool HoldsDevice(int d) const override;
  [[nodiscard]] std::uint64_t HoldUntil(int d) const override;
  [[nodiscard]] bool SharesWant(int d, std::uint64_t now_ns, std::uint64_t period_ns) const override;
  // Gives `d` up at `now_ns`, charging the time held, and hands the
  // devices free to the waiting tenants with the most budget left.
  // `work_running`: work of the turn still runs (its time comes later,
  // through ChargeOverrun).
  void ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_running = false) override;
  // Charges this process's tenant for work it queued in its turn on `d`
  // that ran on after the turn was given back at `released_ns`, until
  // `done_ns`, less the time the tenant itself waited for a turn meanwhile
  // (WaitedNs was `waited_at_release` at the release). The tenant that held
  // the device meanwhile gets that time back (the device was not its own;
  // what it queued behind that work is its own overrun, charged to it in
  // turn). A tenant's debt stops at StuckAfter(period): it is paid back in
  // bounded time, whatever happened.
  void ChargeOverrun(int d, std::uint64_t released_ns, std::uint64_t done_ns, std::uint64_t waited_at_release,
                     std::uint64_t period_ns) override;
  // How long this process's tenant has waited for turns in all, the wait
  // under way included.
  [[nodiscard]] std::uint64_t WaitedNs(std::uint64_t now_ns) override;
  // At the end of its turn on `d`, when no other tenant wants its devices:
  // goes on without giving them back (the time so far is charged; a new
  // turn, or a lent one when the budget is spent and lending is allowed).
  // False: give the device back (ReleaseDevice).
  bool ExtendTurn(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_conserving,
                  std::uint64_t* until_ns) override;
  // Nanoseconds until this process's tenant has budget on `d` again (0: now).
  [[nodiscard]] std::uint64_t BudgetWait(int d, std::uint64_t now_ns, std::uint64_t period_ns) override;
  [[nodiscard]] std::uint64_t TenantCharged(int d);
  // Every tenant's charge on device `d` together.
  [[nodiscard]] std::uint64_t DeviceCharged(int d);
  [[nodiscard]] std::uint64_t Quota(int d);
  [[nodiscard]] std::uint64_t SlotCharged(int d);
  // This process's PID as the node's agent recorded it (0: none yet).
  [[nodiscard]] std::int32_t HostPid() const;
  // For the node's agent, which sees the host's PIDs: records `host_pid` on
  // the live slot of the process whose PID in its own namespace is
  // `ns_pid`. False when no slot, or more than one (processes of several
  // PID namespaces sharing the ledger), has that PID.
  bool RecordHostPid(std::int32_t ns_pid, std::int32_t host_pid);
  void AddThrottled(std::uint64_t ns);
  void AddLaunches(std::uint64_t n);
  [[nodiscard]] std::uint32_t compute_share();

  // Reads the ledger at `path` (freeing dead processes' slots). False with
  // `*error` when it cannot be read; an absent ledger is an empty report.
  static bool Report(const std::string& path, LedgerReport* report, std::string* error);
  // The same through a ledger already open (frees dead processes' slots).
  bool Snapshot(LedgerReport* report, std::string* error);

  // For tests: the slot this process holds; taking the lock without ever
  // giving it back (a process then killed or stopped inside its critical
  // section); and a shorter lock bound.
  [[nodiscard]] int slot() const { return slot_; }
  void LockAndAbandonForTest() { (void)Lock(); }
  void UnlockForTest() { Unlock(); }
  static void SetLockBoundForTest(std::uint64_t ns);

 private:
  Ledger(int fd, LedgerLayout* layout, std::string path);
  // Takes the lock, repairing after a holder died or was fenced out.
  // False when this ledger has no slot (detached after fork).
  bool Lock();
  void Unlock();
  // Frees slots whose process is gone; true when any was freed. Lock held.
  // A sweep asks the kernel about every live slot's lock, and each question
  // walks the file's list of locks: O(processes^2).
  bool ReclaimDeadSlots();
  // The same, when the last sweep is over a second old: processes that
  // come and go, and turns asked for, pay for it at most once a second in
  // all. Lock held.
  void SweepWhenDue();
  void RecomputeTenants();  // lock held
  // The shares (percent) of the tenants that want a device, strict and
  // lending apart, and how many tenants without a share there want it: a
  // tenant wants it while it holds it, waits for it (in
  // `need`, may be null), has work running on it, or asked for it or gave
  // it back within a period; tenant `also` counts in any case.
  struct Demand {
    std::uint32_t strict = 0, lending = 0;  // shares, percent
    std::uint32_t without_share = 0;        // tenants
  };
  [[nodiscard]] Demand DemandOn(std::uint32_t d, const std::uint32_t* need, std::uint32_t also, std::uint64_t now_ns,
                                std::uint64_t period_ns) const;  // lock held
  // The rate (basis points of the device's time) at which tenant `t`'s
  // budget on device `d` grows: its share; for a tenant without a share,
  // an equal part of what the shares of the tenants in `demand` leave; for
  // a lending tenant, where no tenant without a share wants the device,
  // its part of that rest in proportion to its share. Lock held.
  [[nodiscard]] std::uint32_t RateOn(std::uint32_t t, std::uint32_t d, const Demand& demand) const;
  void TopUp(std::uint32_t tenant, int d, std::uint64_t now_ns, std::uint64_t period_ns,
             std::uint32_t rate_bp);                                     // lock held
  void TopUpSelf(int d, std::uint64_t now_ns, std::uint64_t period_ns);  // this tenant, at its rate; lock held
  // This tenant, if it has a share on device `d`, wants it (SharesWant).
  void NoteShareWants(int d, std::uint64_t now_ns);  // lock held
  // Tenant `t`'s share of device `d` (percent). Lock held.
  [[nodiscard]] std::uint32_t ShareOn(std::uint32_t t, std::uint32_t d) const;
  // Grants turns to waiting tenants whose devices are all free, the most
  // budget first. Lock held.
  void Schedule(std::uint64_t now_ns, std::uint64_t period_ns);
  // Tenant `t` starts (or stops) waiting for devices `mask`. Lock held.
  void MarkWaiting(std::uint32_t t, std::uint32_t mask, std::uint64_t now_ns);
  void MarkGranted(std::uint32_t t, std::uint32_t mask, std::uint64_t now_ns);
  // Whether a tenant other than `t` waits for (`need`, may be null) or
  // wanted within a period any of `devices`. Lock held.
  [[nodiscard]] bool WantedByOthers(std::uint32_t t, std::uint32_t devices, const std::uint32_t* need,
                                    std::uint64_t now_ns, std::uint64_t period_ns) const;
  [[nodiscard]] bool SlotAlive(std::uint32_t s) const;
  // Registered, and not detached after fork.
  [[nodiscard]] bool Active() const { return registered_ && slot_ >= 0; }
  static bool OwnerAlive(const void* self, std::uint32_t owner);
  bool ClaimSlot(std::string* error);

  int fd_ = -1;
  LedgerLayout* layout_ = nullptr;
  std::string path_;
  // Read by every thread of the process (hooks, the compute keeper) while
  // the exit handler may change them: atomic.
  std::atomic<int> slot_{-1};  // the slot this process's file lock holds (from Open)
  std::atomic<bool> registered_{false};
  std::uint32_t tenant_ = 0;
  char tenant_name_[kTenantNameBytes] = {};  // kept for a forked child
  std::uint32_t tenant_share_ = 0;
};

}  // namespace stoker::share
