#include "share/ledger_host_pids.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "share/ledger.h"

namespace stoker::share {
namespace {

// Opens the file at `path` (another process's descriptor, through /proc)
// when it is a stoker ledger: only regular files of a ledger's size are
// opened (never a device or a pipe of the process's, whose opening could
// have effects), and the file opened must be the one looked at.
std::unique_ptr<Ledger> OpenIfLedger(const std::string& path) {
  struct stat seen {};
  if (::stat(path.c_str(), &seen) != 0 || !S_ISREG(seen.st_mode) ||
      static_cast<std::uint64_t>(seen.st_size) != sizeof(LedgerLayout))
    return nullptr;
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return nullptr;
  struct stat opened {};
  char magic[sizeof(kLedgerMagic)] = {};
  if (::fstat(fd, &opened) != 0 || opened.st_dev != seen.st_dev || opened.st_ino != seen.st_ino ||
      ::pread(fd, magic, sizeof(magic), 0) != static_cast<ssize_t>(sizeof(magic)) ||
      std::memcmp(magic, kLedgerMagic, sizeof(magic)) != 0) {
    ::close(fd);
    return nullptr;
  }
  std::string error;
  return std::unique_ptr<Ledger>(Ledger::OpenDescriptor(fd, path, &error));
}

}  // namespace

int InnermostPid(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/status";
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return -1;
  char line[512];
  int innermost = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::strncmp(line, "NSpid:", 6) != 0) continue;
    char* at = line + 6;
    for (;;) {
      char* end = nullptr;
      const long value = std::strtol(at, &end, 10);
      if (end == at) break;
      innermost = static_cast<int>(value);
      at = end;
    }
    break;
  }
  std::fclose(f);
  return innermost;
}

std::size_t RecordHostPids(const std::vector<int>& pids) {
  std::size_t recorded = 0;
  for (const int pid : pids) {
    const int own = InnermostPid(pid);
    if (own <= 0 || own == pid) continue;  // the caller's namespace: NVML's PID is its own
    const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
    DIR* dir = ::opendir(fds.c_str());
    if (dir == nullptr) continue;
    while (const dirent* e = ::readdir(dir)) {
      if (e->d_name[0] == '.') continue;
      // Through the process's own descriptor: the same file, whatever
      // folder or mount namespace it was opened from.
      std::unique_ptr<Ledger> ledger = OpenIfLedger(fds + "/" + e->d_name);
      if (ledger && ledger->RecordHostPid(own, pid)) ++recorded;
    }
    ::closedir(dir);
  }
  return recorded;
}

}  // namespace stoker::share
