// Opening a ledger: its file made, checked and mapped, a slot claimed; and
// letting go of it in a forked child.
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <new>

#include "share/ledger.h"
#include "share/ledger_internal.h"

namespace stoker::share {
namespace {

using internal::Errno;
using internal::LockByte;
using internal::SlotByte;
using internal::UnlockByte;

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

Ledger::Ledger(int fd, LedgerLayout* layout, std::string path) : fd_(fd), layout_(layout), path_(std::move(path)) {}

Ledger::~Ledger() {
  if (layout_ != nullptr) ::munmap(layout_, sizeof(LedgerLayout));
  if (fd_ >= 0) ::close(fd_);
}

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

Ledger* Ledger::OpenDescriptor(int fd, const std::string& name, std::string* error) {
  LedgerLayout* layout = MapExisting(fd, name, error);
  if (layout == nullptr) {
    ::close(fd);
    return nullptr;
  }
  auto* ledger = new (std::nothrow) Ledger(fd, layout, name);
  if (ledger == nullptr) {
    ::munmap(layout, sizeof(LedgerLayout));
    ::close(fd);
    return nullptr;
  }
  if (!ledger->ClaimSlot(error)) {
    delete ledger;
    return nullptr;
  }
  return ledger;
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

bool Ledger::SlotAlive(std::uint32_t s) const {
  struct flock probe {};
  probe.l_type = F_WRLCK;
  probe.l_whence = SEEK_SET;
  probe.l_start = SlotByte(s);
  probe.l_len = 1;
  if (::fcntl(fd_, F_OFD_GETLK, &probe) != 0) return true;  // cannot tell: keep it
  return probe.l_type != F_UNLCK;
}

}  // namespace stoker::share
