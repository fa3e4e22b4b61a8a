#include "share/ledger.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <new>

namespace stoker::share {
namespace {

std::string Errno(const char* what, const std::string& path) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "%s '%s': %s", what, path.c_str(), std::strerror(errno));
  return buffer;
}

off_t SlotByte(std::uint32_t s) {
  return static_cast<off_t>(offsetof(LedgerLayout, slots) + s * sizeof(LedgerSlot));
}

// An open-file-description lock on one byte: held until the description
// closes, which the kernel does when the process dies.
bool LockByte(int fd, off_t at) {
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = at;
  lock.l_len = 1;
  return ::fcntl(fd, F_OFD_SETLK, &lock) == 0;
}
void UnlockByte(int fd, off_t at) {
  struct flock lock {};
  lock.l_type = F_UNLCK;
  lock.l_whence = SEEK_SET;
  lock.l_start = at;
  lock.l_len = 1;
  (void)::fcntl(fd, F_OFD_SETLK, &lock);
}

std::uint64_t NowUnix() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec);
}

// Maps an existing ledger file and checks what it holds.
LedgerLayout* MapExisting(int fd, const std::string& path, std::string* error) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    *error = Errno("stat", path);
    return nullptr;
  }
  if (static_cast<std::uint64_t>(st.st_size) < sizeof(LedgerHeader)) {
    *error = "'" + path + "' is not a stoker GPU ledger (too short)";
    return nullptr;
  }
  void* base = ::mmap(nullptr, sizeof(LedgerLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    *error = Errno("map", path);
    return nullptr;
  }
  auto* layout = static_cast<LedgerLayout*>(base);
  const LedgerHeader& h = layout->header;
  char detail[256] = {};
  if (std::memcmp(h.magic, kLedgerMagic, sizeof(kLedgerMagic)) != 0) {
    std::snprintf(detail, sizeof(detail), "not a stoker GPU ledger (bad magic)");
  } else if (h.version != kLedgerVersion) {
    std::snprintf(detail, sizeof(detail),
                  "ledger format version %u; this stoker uses version %u (remove the file when no GPU process uses it)",
                  h.version, kLedgerVersion);
  } else if (h.layout_bytes != sizeof(LedgerLayout) || static_cast<std::uint64_t>(st.st_size) < sizeof(LedgerLayout) ||
             h.max_devices != kMaxDevices || h.max_tenants != kMaxTenants || h.max_slots != kMaxSlots) {
    std::snprintf(detail, sizeof(detail), "ledger layout (%llu bytes) differs from this stoker's (%zu bytes)",
                  static_cast<unsigned long long>(h.layout_bytes), sizeof(LedgerLayout));
  }
  if (detail[0] != '\0') {
    *error = "'" + path + "': " + detail;
    ::munmap(base, sizeof(LedgerLayout));
    return nullptr;
  }
  return layout;
}

// Creates the ledger under a temporary name, initialised, and links it
// into place: a reader never sees a half-initialised ledger. Losing the
// race to another creator is fine (theirs is used).
bool CreateLedger(const std::string& path, unsigned mode, std::string* error) {
  char temp[4096];
  std::snprintf(temp, sizeof(temp), "%s.tmp-%d", path.c_str(), static_cast<int>(::getpid()));
  const int fd = ::open(temp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    *error = Errno("create", temp);
    return false;
  }
  bool ok = ::fchmod(fd, mode) == 0 && ::ftruncate(fd, sizeof(LedgerLayout)) == 0;  // the lock starts free (zero)
  void* base = ok ? ::mmap(nullptr, sizeof(LedgerLayout), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  if (base != MAP_FAILED) {
    auto* layout = static_cast<LedgerLayout*>(base);  // zero-filled by ftruncate
    LedgerHeader& h = layout->header;
    h.version = kLedgerVersion;
    h.max_devices = kMaxDevices;
    h.max_tenants = kMaxTenants;
    h.max_slots = kMaxSlots;
    h.layout_bytes = sizeof(LedgerLayout);
    std::memcpy(h.magic, kLedgerMagic, sizeof(kLedgerMagic));  // last: what readers check
    ::msync(base, sizeof(LedgerHeader), MS_SYNC);
    ::munmap(base, sizeof(LedgerLayout));
  } else {
    ok = false;
  }
  if (!ok) *error = Errno("initialise", temp);
  ::close(fd);
  if (ok && ::link(temp, path.c_str()) != 0 && errno != EEXIST) {
    *error = Errno("create", path);
    ok = false;
  }
  ::unlink(temp);
  return ok || errno == EEXIST;
}

}  // namespace

Ledger::Ledger(int fd, LedgerLayout* layout, std::string path) : fd_(fd), layout_(layout), path_(std::move(path)) {}

Ledger::~Ledger() {
  if (layout_ != nullptr) ::munmap(layout_, sizeof(LedgerLayout));
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// The folder of a user's ledger: made sticky and world-writable if missing
// (every user makes their own file there, none can remove another's);
// refused when it is a symbolic link, or when another user owns it and it
// is not sticky (they could replace our files).
bool PrepareFolder(const std::string& path, std::string* error) {
  const std::string dir = path.substr(0, path.rfind('/'));
  if (dir.empty()) return true;
  if (::mkdir(dir.c_str(), 0777) == 0) {
    if (::chmod(dir.c_str(), 01777) != 0) {
      *error = Errno("make world-writable and sticky", dir);
      return false;
    }
    return true;
  }
  if (errno != EEXIST) {
    *error = Errno("make the folder", dir);
    return false;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    *error = Errno("stat", dir);
    return false;
  }
  char detail[256] = {};
  if (S_ISLNK(st.st_mode)) {
    std::snprintf(detail, sizeof(detail), "is a symbolic link (uid %u): refusing it", static_cast<unsigned>(st.st_uid));
  } else if (!S_ISDIR(st.st_mode)) {
    std::snprintf(detail, sizeof(detail), "is not a folder");
  } else if (st.st_uid != ::geteuid() && st.st_uid != 0 && !(st.st_mode & S_ISVTX)) {
    std::snprintf(detail, sizeof(detail),
                  "belongs to uid %u and is not sticky: its owner could replace your ledger (remove it, or let "
                  "`stoker gpu agent` make it)",
                  static_cast<unsigned>(st.st_uid));
  }
  if (detail[0] != '\0') {
    *error = "the GPU state folder '" + dir + "' " + detail;
    return false;
  }
  return true;
}

}  // namespace

Ledger* Ledger::Open(const std::string& path, std::string* error, const LedgerFile& file) {
  if (file.make_dir && !PrepareFolder(path, error)) return nullptr;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) {
      struct stat st {};
      if (file.must_own && ::fstat(fd, &st) == 0 && st.st_uid != ::geteuid()) {
        char detail[256];
        std::snprintf(detail, sizeof(detail),
                      "belongs to uid %u, not to this user (uid %u): another user made it under your name; remove it "
                      "(as root or uid %u), or set STOKER_GPU_LEDGER",
                      static_cast<unsigned>(st.st_uid), static_cast<unsigned>(::geteuid()),
                      static_cast<unsigned>(st.st_uid));
        *error = "the ledger '" + path + "' " + detail;
        ::close(fd);
        return nullptr;
      }
      LedgerLayout* layout = MapExisting(fd, path, error);
      if (layout == nullptr) {
        ::close(fd);
        return nullptr;
      }
      auto* ledger = new (std::nothrow) Ledger(fd, layout, path);
      if (ledger != nullptr && !ledger->ClaimSlot(error)) {
        delete ledger;
        return nullptr;
      }
      return ledger;
    }
    if (errno != ENOENT) {
      *error = Errno(errno == ELOOP ? "refusing a symbolic link at" : "open", path);
      return nullptr;
    }
    if (!CreateLedger(path, file.mode, error)) return nullptr;
  }
  *error = "'" + path + "' keeps disappearing";
  return nullptr;
}

// A slot nobody uses whose byte this description can lock is ours: the
// kernel arbitrates, so no lock is needed. It is filled in by Register.
bool Ledger::ClaimSlot(std::string* error) {
  for (std::uint32_t i = 0; i < kMaxSlots; ++i) {
    if (__atomic_load_n(&layout_->slots[i].in_use, __ATOMIC_ACQUIRE)) continue;
    if (!LockByte(fd_, SlotByte(i))) continue;  // another process's, or a dead one's not yet reclaimed
    if (__atomic_load_n(&layout_->slots[i].in_use, __ATOMIC_ACQUIRE)) {
      // A dead process's slot, locked between our look and our lock: its
      // charge is reclaimed under the ledger's lock, not here.
      UnlockByte(fd_, SlotByte(i));
      continue;
    }
    slot_ = static_cast<int>(i);
    return true;
  }
  char detail[160];
  std::snprintf(detail, sizeof(detail), "has no free process slot (%u at most)", kMaxSlots);
  *error = "the ledger at '" + path_ + "' " + detail;
  return false;
}

namespace {
std::uint64_t g_lock_bound_ns = kLockBoundNs;
// The acquisition this thread holds (a thread holds one ledger's lock at a
// time; threads of one process share its slot, so the word is per thread).
thread_local std::uint32_t t_held_word = 0;
}  // namespace

void Ledger::SetLockBoundForTest(std::uint64_t ns) {
  g_lock_bound_ns = ns;
}

bool Ledger::OwnerAlive(const void* self, std::uint32_t owner) {
  const auto* ledger = static_cast<const Ledger*>(self);
  if (owner == 0 || owner > kMaxSlots) return false;              // garbage: take it over
  if (static_cast<int>(owner) == ledger->slot_ + 1) return true;  // another of our threads
  return ledger->SlotAlive(owner - 1);
}

bool Ledger::Lock() {
  if (slot_ < 0) return false;
  std::uint32_t held = 0;
  const LockTaken taken = LockLedger(&layout_->header.lock, static_cast<std::uint32_t>(slot_) + 1, g_lock_bound_ns,
                                     &Ledger::OwnerAlive, this, &held);
  t_held_word = held;
  if (taken == LockTaken::kRepair) {
    // The last holder died, or was fenced out, inside its critical section:
    // it may have charged its slot and not its tenant. The slots are the
    // truth (each is written only by its own process).
    (void)ReclaimDeadSlots();
    RecomputeTenants();
    ++layout_->header.repairs;
  }
  return true;
}

void Ledger::Unlock() {
  (void)UnlockLedger(&layout_->header.lock, t_held_word);
}

bool Ledger::SlotAlive(std::uint32_t s) const {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = SlotByte(s);
  probe.l_len = 1;
  if (::fcntl(fd_, F_OFD_GETLK, &probe) != 0) return true;  // cannot tell: keep it
  return probe.l_type != F_UNLCK;
}

bool Ledger::ReclaimDeadSlots() {
  bool any = false;
  for (std::uint32_t s = 0; s < kMaxSlots; ++s) {
    LedgerSlot& slot = layout_->slots[s];
    if (!slot.in_use || static_cast<int>(s) == slot_ || SlotAlive(s)) continue;
    if (slot.tenant < kMaxTenants) {
      LedgerTenant& t = layout_->tenants[slot.tenant];
      for (std::uint32_t d = 0; d < kMaxDevices; ++d)
        t.charged[d] = t.charged[d] >= slot.charged[d] ? t.charged[d] - slot.charged[d] : 0;
    }
    std::memset(&slot, 0, sizeof(slot));
    any = true;
  }
  // Tenants without a live process go too.
  bool used[kMaxTenants] = {};
  for (const auto& slot : layout_->slots)
    if (slot.in_use && slot.tenant < kMaxTenants) used[slot.tenant] = true;
  for (std::uint32_t t = 0; t < kMaxTenants; ++t)
    if (layout_->tenants[t].in_use && !used[t] && !(registered_ && tenant_ == t)) {
      std::memset(&layout_->tenants[t], 0, sizeof(LedgerTenant));
      for (auto& device : layout_->devices)  // its turns end with it
        if (device.holder == t + 1) __atomic_store_n(&device.holder, 0u, __ATOMIC_RELEASE);
    }
  return any;
}

void Ledger::RecomputeTenants() {
  for (auto& t : layout_->tenants) std::memset(t.charged, 0, sizeof(t.charged));
  for (const auto& slot : layout_->slots) {
    if (!slot.in_use || slot.tenant >= kMaxTenants) continue;
    for (std::uint32_t d = 0; d < kMaxDevices; ++d) layout_->tenants[slot.tenant].charged[d] += slot.charged[d];
  }
}

bool Ledger::Register(std::string_view tenant, std::uint32_t compute_share, std::string* error) {
  if (tenant.empty() || tenant.size() >= kTenantNameBytes) {
    *error = "the tenant name must have 1 to 79 characters";
    return false;
  }
  if (registered_) {
    *error = "this process is already registered in the ledger at '" + path_ + "'";
    return false;
  }
  if (!Lock()) {
    *error = "the ledger at '" + path_ + "' was closed in this process (forked child not reopened)";
    return false;
  }
  (void)ReclaimDeadSlots();
  int t = -1, free_t = -1;
  for (std::uint32_t i = 0; i < kMaxTenants; ++i) {
    LedgerTenant& e = layout_->tenants[i];
    if (e.in_use && std::string_view(e.name) == tenant) t = static_cast<int>(i);
    if (!e.in_use && free_t < 0) free_t = static_cast<int>(i);
  }
  if (t >= 0 && layout_->tenants[t].compute_share != compute_share) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "tenant '%.*s' has a compute share of %u%% (set by another of its processes); this process asks "
                  "for %u%%: all processes of a tenant must agree",
                  static_cast<int>(tenant.size()), tenant.data(), layout_->tenants[t].compute_share, compute_share);
    *error = detail;
    Unlock();
    return false;
  }
  if (t < 0) {
    if (free_t < 0) {
      char detail[160];
      std::snprintf(detail, sizeof(detail), "has no room for another tenant (%u at most)", kMaxTenants);
      *error = "the ledger at '" + path_ + "' " + detail;
      Unlock();
      return false;
    }
    t = free_t;
    LedgerTenant& e = layout_->tenants[t];
    std::memset(&e, 0, sizeof(e));
    std::memcpy(e.name, tenant.data(), tenant.size());
    for (auto& q : e.quota) q = kNoQuota;
    e.compute_share = compute_share;
    e.in_use = 1;
  }
  LedgerSlot& slot = layout_->slots[slot_];
  std::memset(&slot, 0, sizeof(slot));
  slot.pid = static_cast<std::int32_t>(::getpid());
  slot.tenant = static_cast<std::uint32_t>(t);
  slot.started_unix = NowUnix();
  __atomic_store_n(&slot.in_use, 1u, __ATOMIC_RELEASE);
  tenant_ = static_cast<std::uint32_t>(t);
  registered_ = true;
  std::memset(tenant_name_, 0, sizeof(tenant_name_));
  std::memcpy(tenant_name_, tenant.data(), tenant.size());
  tenant_share_ = compute_share;
  Unlock();
  return true;
}

void Ledger::Unregister() {
  if (!Active() || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  for (std::uint32_t d = 0; d < kMaxDevices; ++d)
    t.charged[d] = t.charged[d] >= slot.charged[d] ? t.charged[d] - slot.charged[d] : 0;
  std::memset(&slot, 0, sizeof(slot));  // the slot stays claimed (its byte locked) until the ledger closes
  registered_ = false;
  (void)ReclaimDeadSlots();  // the tenant goes with its last process
  Unlock();
}

void Ledger::DetachAfterFork() {
  // Only system calls: this runs in the child straight after fork. The
  // mapping references the parent's file description as much as the
  // descriptor does; both must go for the parent's slot lock to die with it.
  if (layout_ != nullptr) ::munmap(layout_, sizeof(LedgerLayout));
  if (fd_ >= 0) ::close(fd_);
  layout_ = nullptr;
  fd_ = -1;
  slot_ = -1;
}

bool Ledger::ReopenAfterFork(std::string* error) {
  if (layout_ != nullptr) DetachAfterFork();
  const bool was_registered = registered_;
  registered_ = false;
  const int fd = ::open(path_.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    *error = Errno("open", path_);
    return false;
  }
  layout_ = MapExisting(fd, path_, error);
  if (layout_ == nullptr) {
    ::close(fd);
    return false;
  }
  fd_ = fd;
  if (!ClaimSlot(error)) return false;
  if (!was_registered) return true;
  const std::string tenant(tenant_name_);
  return Register(tenant, tenant_share_, error);
}

int Ledger::Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) {
  if (!Lock()) return -1;
  int found = -1, free_d = -1;
  for (std::uint32_t d = 0; d < kMaxDevices; ++d) {
    LedgerDevice& e = layout_->devices[d];
    if (e.in_use && std::memcmp(e.uuid, uuid, 16) == 0) found = static_cast<int>(d);
    if (!e.in_use && free_d < 0) free_d = static_cast<int>(d);
  }
  if (found < 0 && free_d >= 0) {
    LedgerDevice& e = layout_->devices[free_d];
    std::memcpy(e.uuid, uuid, 16);
    e.physical_bytes = physical_bytes;
    e.in_use = 1;
    found = free_d;
  }
  Unlock();
  return found;
}

bool Ledger::SetQuota(int d, std::uint64_t quota, std::string* error) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& t = layout_->tenants[tenant_];
  bool ok = true;
  if (t.quota[d] == kNoQuota) {
    t.quota[d] = quota;
  } else if (t.quota[d] != quota) {
    char detail[256];
    std::snprintf(detail, sizeof(detail),
                  "tenant '%s' has a quota of %llu bytes on %s (set by another of its processes); this process asks "
                  "for %llu: all processes of a tenant must agree",
                  t.name, static_cast<unsigned long long>(t.quota[d]), FormatUuid(layout_->devices[d].uuid).c_str(),
                  static_cast<unsigned long long>(quota));
    *error = detail;
    ok = false;
  }
  Unlock();
  return ok;
}

bool Ledger::Charge(int d, std::uint64_t bytes, bool count_refusal) {
  if (!Active() || d < 0 || !Lock()) return false;
  LedgerTenant& t = layout_->tenants[tenant_];
  LedgerSlot& slot = layout_->slots[slot_];
  auto fits = [&] { return t.quota[d] == kNoQuota || (bytes <= t.quota[d] && t.charged[d] <= t.quota[d] - bytes); };
  bool ok = fits();
  if (!ok && ReclaimDeadSlots()) ok = fits();  // a dead process's memory is the driver's again
  if (ok) {
    slot.charged[d] += bytes;
    t.charged[d] += bytes;
  } else if (count_refusal) {
    ++slot.oom_refusals;
  }
  Unlock();
  return ok;
}

void Ledger::ForceCharge(int d, std::uint64_t bytes) {
  if (!Active() || d < 0 || !Lock()) return;
  layout_->slots[slot_].charged[d] += bytes;
  layout_->tenants[tenant_].charged[d] += bytes;
  Unlock();
}

void Ledger::Uncharge(int d, std::uint64_t bytes) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  const std::uint64_t b = bytes <= slot.charged[d] ? bytes : slot.charged[d];
  slot.charged[d] -= b;
  t.charged[d] = t.charged[d] >= b ? t.charged[d] - b : 0;
  Unlock();
}

void Ledger::Settle(int d, std::uint64_t reserved, std::uint64_t actual) {
  if (!Active() || d < 0 || !Lock()) return;
  LedgerSlot& slot = layout_->slots[slot_];
  LedgerTenant& t = layout_->tenants[tenant_];
  if (actual >= reserved) {
    slot.charged[d] += actual - reserved;
    t.charged[d] += actual - reserved;
  } else {
    const std::uint64_t b = std::min(reserved - actual, slot.charged[d]);
    slot.charged[d] -= b;
    t.charged[d] = t.charged[d] >= b ? t.charged[d] - b : 0;
  }
  Unlock();
}

std::uint64_t Ledger::ContextBytes(int d) const {
  return layout_ != nullptr && d >= 0 ? __atomic_load_n(&layout_->devices[d].context_bytes, __ATOMIC_RELAXED) : 0;
}

void Ledger::LearnContextBytes(int d, std::uint64_t bytes) {
  if (layout_ != nullptr && d >= 0 && bytes > 0)
    __atomic_store_n(&layout_->devices[d].context_bytes, bytes, __ATOMIC_RELAXED);
}

std::uint64_t Ledger::TenantCharged(int d) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const std::uint64_t v = layout_->tenants[tenant_].charged[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::DeviceCharged(int d) {
  if (d < 0 || !Lock()) return 0;
  std::uint64_t v = 0;
  for (const auto& t : layout_->tenants)
    if (t.in_use) v += t.charged[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::Quota(int d) {
  if (!Active() || d < 0 || !Lock()) return kNoQuota;
  const std::uint64_t v = layout_->tenants[tenant_].quota[d];
  Unlock();
  return v;
}

std::uint64_t Ledger::SlotCharged(int d) {
  if (!Active() || d < 0 || !Lock()) return 0;
  const std::uint64_t v = layout_->slots[slot_].charged[d];
  Unlock();
  return v;
}

void Ledger::AddThrottled(std::uint64_t ns) {
  if (Active()) __atomic_fetch_add(&layout_->slots[slot_].throttled_ns, ns, __ATOMIC_RELAXED);
}
void Ledger::AddLaunches(std::uint64_t n) {
  if (Active()) __atomic_fetch_add(&layout_->slots[slot_].launches, n, __ATOMIC_RELAXED);
}
std::uint32_t Ledger::compute_share() {
  return Active() ? layout_->tenants[tenant_].compute_share : 0;
}

}  // namespace stoker::share
