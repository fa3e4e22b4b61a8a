// The fake GPUs' state, shared by the test doubles of libcuda.so.1 and
// libnvidia-ml.so.1 and by every process using them: each device's
// capacity, and what each live process holds on it, in a file every process
// maps (FAKE_GPU_STATE, default /dev/shm/stoker-fake-gpu-<uid>). Physical
// use of a device is the sum over live processes, as a real GPU's is.
#pragma once

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace fake_gpu {

inline constexpr int kMaxDevices = 8;
inline constexpr int kMaxProcesses = 256;

struct Process {
  std::int32_t pid;
  std::uint32_t in_use;
  std::uint64_t used[kMaxDevices];
  // Its PID in the node's namespace, as a real NVML lists it: read from the
  // host's /proc (/proc/self), which a process in a PID namespace of its
  // own sees when /proc was not mounted anew (the tests' `unshare --pid`).
  std::int32_t host_pid;
  std::uint32_t reserved;
};

struct State {
  std::uint32_t magic;
  std::uint32_t devices;
  std::uint64_t capacity[kMaxDevices];
  std::uint8_t uuid[kMaxDevices][16];
  std::uint64_t busy_until_ns[kMaxDevices];  // the device's timeline (time-sliced kernels)
  pthread_mutex_t mu;
  Process processes[kMaxProcesses];
  std::int32_t numa[kMaxDevices];   // NUMA node of each device (FAKE_GPU_NUMA)
  std::uint32_t lost[kMaxDevices];  // set by a test: 1 NVML reports the device lost, 2 it is gone
  // Collectives (kernels named "allreduce_<group>_<peers>_<micros>"): the
  // n-th of a group ends once all its peers have launched their n-th, like
  // an NCCL kernel that spins until its peers arrive.
  struct Collective {
    std::uint64_t seq;
    std::uint32_t arrived;
    std::uint64_t last_start_ns;
  };
  Collective collectives[8][64];
};

inline std::uint64_t EnvU64(const char* name, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

// The i-th item of a comma-separated list ("a,b,c"; the last repeats).
inline std::uint64_t EnvListU64(const char* name, std::uint32_t i, std::uint64_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == 0) return fallback;
  std::uint64_t value = fallback;
  for (std::uint32_t k = 0; k <= i; ++k) {
    char* end = nullptr;
    value = std::strtoull(v, &end, 10);
    if (*end != ',') break;
    v = end + 1;
  }
  return value;
}

// Maps the shared state, creating it from FAKE_GPU_DEVICES (default 2),
// FAKE_GPU_MEMORY (bytes per device, default 16 GiB; a comma-separated
// list gives each device its own) and FAKE_GPU_NUMA (NUMA node per device,
// a list, default 0) when missing.
inline State* Shared() {
  static State* state = [] {
    char path[512];
    const char* env = std::getenv("FAKE_GPU_STATE");
    if (env && *env) {
      std::snprintf(path, sizeof(path), "%s", env);
    } else {
      std::snprintf(path, sizeof(path), "/dev/shm/stoker-fake-gpu-%d", static_cast<int>(::getuid()));
    }
    int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) std::abort();
    // The first process to take the file's lock initialises it.
    struct flock lk {};
    lk.l_type = F_WRLCK;
    lk.l_whence = SEEK_SET;
    lk.l_len = 0;
    while (::fcntl(fd, F_OFD_SETLKW, &lk) != 0 && errno == EINTR) {
    }
    struct stat st {};
    ::fstat(fd, &st);
    if (static_cast<std::size_t>(st.st_size) < sizeof(State) && ::ftruncate(fd, sizeof(State)) != 0) std::abort();
    void* base = ::mmap(nullptr, sizeof(State), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) std::abort();
    auto* s = static_cast<State*>(base);
    if (s->magic != 0x46474756u) {
      s->devices = static_cast<std::uint32_t>(EnvU64("FAKE_GPU_DEVICES", 2));
      if (s->devices > kMaxDevices) s->devices = kMaxDevices;
      for (std::uint32_t d = 0; d < s->devices; ++d) {
        s->capacity[d] = EnvListU64("FAKE_GPU_MEMORY", d, std::uint64_t{16} << 30);
        s->numa[d] = static_cast<std::int32_t>(EnvListU64("FAKE_GPU_NUMA", d, 0));
        s->lost[d] = 0;
        for (int i = 0; i < 16; ++i) s->uuid[d][i] = static_cast<std::uint8_t>(0x10 * (d + 1) + i);
      }
      pthread_mutexattr_t attr;
      pthread_mutexattr_init(&attr);
      pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
      pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
      pthread_mutex_init(&s->mu, &attr);
      pthread_mutexattr_destroy(&attr);
      s->magic = 0x46474756u;
    }
    lk.l_type = F_UNLCK;
    ::fcntl(fd, F_OFD_SETLK, &lk);
    ::close(fd);
    return s;
  }();
  return state;
}

class Lock {
 public:
  Lock() {
    if (pthread_mutex_lock(&Shared()->mu) == EOWNERDEAD) pthread_mutex_consistent(&Shared()->mu);
  }
  ~Lock() { pthread_mutex_unlock(&Shared()->mu); }
};

inline bool Alive(std::int32_t pid) {
  return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM);
}

// Process `pid`'s record, made if missing (lock held).
inline Process* Other(std::int32_t pid) {
  State* s = Shared();
  Process* free_slot = nullptr;
  for (auto& p : s->processes) {
    if (p.in_use && p.pid == pid) return &p;
    if (!p.in_use || !Alive(p.pid)) {
      if (free_slot == nullptr) free_slot = &p;
    }
  }
  if (free_slot == nullptr) std::abort();
  std::memset(free_slot, 0, sizeof(Process));
  free_slot->pid = pid;
  char self[32] = {};
  if (pid == ::getpid() && ::readlink("/proc/self", self, sizeof(self) - 1) > 0) free_slot->host_pid = std::atoi(self);
  free_slot->in_use = 1;
  return free_slot;
}

// This process's record (lock held).
inline Process* Self() {
  return Other(static_cast<std::int32_t>(::getpid()));
}

// Bytes in use on physical device `d` by every live process (lock held).
inline std::uint64_t UsedOn(int d) {
  std::uint64_t used = 0;
  for (const auto& p : Shared()->processes)
    if (p.in_use && Alive(p.pid)) used += p.used[d];
  return used;
}

}  // namespace fake_gpu
