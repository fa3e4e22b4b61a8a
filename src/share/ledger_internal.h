// Helpers the ledger's files share (ledger.cc, ledger_file.cc): a slot's
// byte in the file, and the open-file-description lock on it that tells a
// live process's slot from a dead one's.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <time.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "share/ledger.h"

namespace stoker::share::internal {

inline std::string Errno(const char* what, const std::string& path) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), "%s '%s': %s", what, path.c_str(), std::strerror(errno));
  return buffer;
}

inline off_t SlotByte(std::uint32_t s) {
  return static_cast<off_t>(offsetof(LedgerLayout, slots) + s * sizeof(LedgerSlot));
}

// An open-file-description lock on one byte (F_WRLCK to take it, F_UNLCK
// to give it back): held until the description closes, which the kernel
// does when the process dies.
inline bool SetByteLock(int fd, off_t at, short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = at;
  lock.l_len = 1;
  return ::fcntl(fd, F_OFD_SETLK, &lock) == 0;
}
inline bool LockByte(int fd, off_t at) {
  return SetByteLock(fd, at, F_WRLCK);
}
inline void UnlockByte(int fd, off_t at) {
  (void)SetByteLock(fd, at, F_UNLCK);
}

inline std::uint64_t NowMonotonicNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

inline std::uint64_t NowUnix() {
  struct timespec ts {};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec);
}

}  // namespace stoker::share::internal
