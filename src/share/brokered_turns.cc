#include "share/brokered_turns.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "share/ledger_internal.h"

namespace stoker::share {
namespace {

TurnsRequest NewRequest(TurnsOp op, int d = -1) {
  TurnsRequest request{};
  request.version = kTurnsProtocolVersion;
  request.op = static_cast<std::uint32_t>(op);
  request.device = d;
  return request;
}

// A full send or receive of one message, waiting at most `timeout_ms`.
bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    const int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    return n == 1 && (p.revents & events);
  }
}

// How long a call may wait on the agent: its calls take microseconds, so
// an agent that takes this long is stopped or gone.
constexpr int kCallTimeoutMs = 2000;

}  // namespace

bool TurnsAreBrokered(const std::string& turns_path) {
  struct stat st {};
  return ::lstat(turns_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == 0 && (st.st_mode & 0022) == 0;
}

BrokeredTurns* BrokeredTurns::Open(const Options& options, std::string* error) {
  const int fd = ::open(options.turns_path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || ::fstat(fd, &st) != 0) {
    *error = "opening the node agent's compute schedule '" + options.turns_path + "': " + std::strerror(errno) +
             " (is `stoker gpu agent` running?)";
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  if (static_cast<std::uint64_t>(st.st_size) != sizeof(LedgerLayout)) {
    ::close(fd);
    *error = "the compute schedule '" + options.turns_path + "' is not one of this stoker release (" +
             std::to_string(st.st_size) + " bytes, expected " + std::to_string(sizeof(LedgerLayout)) + ")";
    return nullptr;
  }
  void* map = ::mmap(nullptr, sizeof(LedgerLayout), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (map == MAP_FAILED) {
    *error = "mapping the compute schedule '" + options.turns_path + "': " + std::strerror(errno);
    return nullptr;
  }
  const auto* layout = static_cast<const LedgerLayout*>(map);
  if (std::memcmp(layout->header.magic, kLedgerMagic, sizeof(kLedgerMagic)) != 0 ||
      layout->header.version != kLedgerVersion) {
    ::munmap(map, sizeof(LedgerLayout));
    *error = "the compute schedule '" + options.turns_path + "' is not a ledger of version " +
             std::to_string(kLedgerVersion);
    return nullptr;
  }
  auto* turns = new (std::nothrow) BrokeredTurns(options);
  if (turns == nullptr) {
    ::munmap(map, sizeof(LedgerLayout));
    *error = "out of memory";
    return nullptr;
  }
  turns->layout_ = layout;
  bool refused = false;
  {
    std::lock_guard<std::mutex> lock(turns->mu_);
    refused = !turns->Ready(error) && turns->refused_;
  }
  if (refused) {
    delete turns;
    return nullptr;
  }
  return turns;
}

BrokeredTurns::~BrokeredTurns() {
  if (fd_ >= 0) ::close(fd_);
  if (layout_ != nullptr) ::munmap(const_cast<LedgerLayout*>(layout_), sizeof(LedgerLayout));
}

void BrokeredTurns::Disconnect(const char* why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  __atomic_store_n(&tenant_index_plus1_, 0u, __ATOMIC_RELEASE);
  for (std::uint32_t i = 0; i < known_count_; ++i) {
    __atomic_store_n(&known_[i].remote, -1, __ATOMIC_RELEASE);
    known_[i].waiting = false;
    known_[i].budget_ready_ns = 0;
  }
  next_attempt_ns_ = internal::NowMonotonicNs() + kReconnectNs;
  if (!said_waiting_ && why != nullptr) {
    // (A process without a share waits for no turn while the agent is
    // away: the mark of share tenants wanting a card goes stale.)
    std::fprintf(stderr, "stoker: the GPU agent's compute schedule at '%s' does not answer (%s): %s\n",
                 options_.socket_path.c_str(), why,
                 options_.has_share ? "launches under a compute share wait until it does"
                                    : "this process (no compute share) launches without turns until it does");
    said_waiting_ = true;
  }
}

bool BrokeredTurns::Call(TurnsRequest request, TurnsReply* reply) {
  if (fd_ < 0) return false;
  if (!WaitFor(fd_, POLLOUT, kCallTimeoutMs)) {
    Disconnect("it took no request within 2 s");
    return false;
  }
  if (::send(fd_, &request, sizeof(request), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(request))) {
    Disconnect(std::strerror(errno));
    return false;
  }
  if (!WaitFor(fd_, POLLIN, kCallTimeoutMs)) {
    Disconnect("no reply within 2 s");
    return false;
  }
  const ssize_t n = ::recv(fd_, reply, sizeof(*reply), 0);
  if (n != static_cast<ssize_t>(sizeof(*reply)) || reply->version != kTurnsProtocolVersion) {
    Disconnect(n == 0 ? "it closed the connection" : "a reply not of this release");
    return false;
  }
  return true;
}

bool BrokeredTurns::Ready(std::string* error) {
  if (fd_ >= 0) return true;
  if (refused_) return false;
  const std::uint64_t now = internal::NowMonotonicNs();
  if (now < next_attempt_ns_) return false;
  next_attempt_ns_ = now + kReconnectNs;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options_.socket_path.size() >= sizeof(address.sun_path)) {
    *error = "the agent's socket path '" + options_.socket_path + "' is too long";
    refused_ = true;
    return false;
  }
  std::memcpy(address.sun_path, options_.socket_path.c_str(), options_.socket_path.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    const std::string why = std::string("connecting: ") + std::strerror(errno);
    *error = why;
    Disconnect(why.c_str());
    return false;
  }
  TurnsRequest hello = NewRequest(TurnsOp::kHello);
  std::snprintf(hello.tenant, sizeof(hello.tenant), "%s", options_.tenant.c_str());
  hello.a = options_.compute_share;
  // The pinned limits file, when there is one, goes along (SCM_RIGHTS).
  const int proof = options_.proof_path.empty() ? -1 : ::open(options_.proof_path.c_str(), O_RDONLY | O_CLOEXEC);
  iovec io{&hello, sizeof(hello)};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr message{};
  message.msg_iov = &io;
  message.msg_iovlen = 1;
  if (proof >= 0) {
    message.msg_control = control;
    message.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&message);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &proof, sizeof(int));
  }
  const bool sent = WaitFor(fd_, POLLOUT, kCallTimeoutMs) &&
                    ::sendmsg(fd_, &message, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(hello));
  if (proof >= 0) ::close(proof);
  TurnsReply reply{};
  if (!sent || !WaitFor(fd_, POLLIN, kCallTimeoutMs) ||
      ::recv(fd_, &reply, sizeof(reply), 0) != static_cast<ssize_t>(sizeof(reply))) {
    Disconnect(
        "it closed the connection unanswered: it serves as many of this user's processes as it takes, or "
        "is stopping");
    *error = "the agent did not answer";
    return false;
  }
  if (!reply.ok) {
    reply.error[sizeof(reply.error) - 1] = '\0';
    *error = std::string("the GPU agent refused this process a place in the compute schedule: ") + reply.error;
    std::fprintf(stderr, "stoker: %s\n", error->c_str());
    refused_ = true;  // launches under a share wait for good: never unlimited
    Disconnect(nullptr);
    return false;
  }
  const std::int32_t tenant_index = reply.value;
  // Our devices again, under the agent's indices (an agent that restarted
  // may have a schedule of its own).
  for (std::uint32_t i = 0; i < known_count_; ++i) {
    TurnsRequest device = NewRequest(TurnsOp::kDevice);
    std::memcpy(device.uuid, known_[i].uuid, 16);
    device.a = known_[i].physical_bytes;
    if (!Call(device, &reply)) return false;
    if (!reply.ok) {
      reply.error[sizeof(reply.error) - 1] = '\0';
      Disconnect(reply.error);
      return false;
    }
    if (known_[i].share != 0) {
      TurnsRequest share = NewRequest(TurnsOp::kSetShare, reply.value);
      share.a = known_[i].share;
      TurnsReply shared{};
      if (!Call(share, &shared)) return false;
      if (!shared.ok) {
        shared.error[sizeof(shared.error) - 1] = '\0';
        std::fprintf(stderr, "stoker: the GPU agent refused a compute share: %s\n", shared.error);
        refused_ = true;
        Disconnect(nullptr);
        return false;
      }
    }
    __atomic_store_n(&known_[i].remote, reply.value, __ATOMIC_RELEASE);
    __atomic_store_n(&known_[i].mark, reply.value, __ATOMIC_RELEASE);
  }
  if (said_waiting_) std::fprintf(stderr, "stoker: the GPU agent's compute schedule answers again\n");
  said_waiting_ = false;
  __atomic_store_n(&tenant_index_plus1_, static_cast<std::uint32_t>(tenant_index) + 1, __ATOMIC_RELEASE);
  return true;
}

bool BrokeredTurns::Served(int d) const {
  return d >= 0 && static_cast<std::uint32_t>(d) < known_count_ && fd_ >= 0 && known_[d].remote >= 0;
}

int BrokeredTurns::Device(const std::uint8_t uuid[16], std::uint64_t physical_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::uint32_t i = 0; i < known_count_; ++i)
    if (std::memcmp(known_[i].uuid, uuid, 16) == 0) return static_cast<int>(i);
  if (known_count_ == kMaxDevices) return -1;
  Known& k = known_[known_count_];
  std::memcpy(k.uuid, uuid, 16);
  k.physical_bytes = physical_bytes;
  k.share = 0;
  k.remote = -1;
  k.mark = -1;
  k.waiting = false;
  k.budget_ready_ns = 0;
  std::string error;
  if (Ready(&error)) {
    TurnsRequest request = NewRequest(TurnsOp::kDevice);
    std::memcpy(request.uuid, uuid, 16);
    request.a = physical_bytes;
    TurnsReply reply{};
    if (Call(request, &reply)) {
      if (!reply.ok) return -1;
      __atomic_store_n(&k.remote, reply.value, __ATOMIC_RELEASE);
      __atomic_store_n(&k.mark, reply.value, __ATOMIC_RELEASE);
    }
  }
  return static_cast<int>(known_count_++);
}

bool BrokeredTurns::SetComputeShare(int d, std::uint32_t share, std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  if (d < 0 || static_cast<std::uint32_t>(d) >= known_count_) return false;
  known_[d].share = share;
  const std::int32_t remote = __atomic_load_n(&known_[d].remote, __ATOMIC_ACQUIRE);
  if (remote < 0) return true;  // told when the agent answers
  TurnsRequest request = NewRequest(TurnsOp::kSetShare, remote);
  request.a = share;
  TurnsReply reply{};
  if (!Call(request, &reply)) return true;
  if (!reply.ok) {
    reply.error[sizeof(reply.error) - 1] = '\0';
    *error = reply.error;
    return false;
  }
  return true;
}

bool BrokeredTurns::AcquireDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, std::uint64_t* until_ns,
                                  bool work_conserving) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string error;
  if (d < 0 || static_cast<std::uint32_t>(d) >= known_count_ || !Ready(&error)) return false;
  Known& k = known_[d];
  if (k.waiting) {
    // Already waiting in the agent's schedule: while another tenant's turn
    // runs, asking again is pointless (the agent hands us the device when
    // that turn is given back, or lets us take it from a holder stuck past
    // its time, which asking after `hold_until` does).
    const LedgerDevice& device = layout_->devices[k.remote];
    const std::uint32_t holder = __atomic_load_n(&device.holder, __ATOMIC_ACQUIRE);
    const std::uint32_t me = __atomic_load_n(&tenant_index_plus1_, __ATOMIC_ACQUIRE);
    if (holder != 0 && holder != me && now_ns < __atomic_load_n(&device.hold_until_ns, __ATOMIC_ACQUIRE)) return false;
    // Out of budget: not before it has some again.
    if (now_ns < k.budget_ready_ns) return false;
  }
  TurnsRequest request = NewRequest(TurnsOp::kAcquire, k.remote);
  request.a = now_ns;
  request.b = period_ns;
  request.flag = work_conserving;
  TurnsReply reply{};
  if (!Call(request, &reply)) return false;
  k.waiting = !reply.ok;
  if (!reply.ok) {
    k.budget_ready_ns = now_ns + reply.a;
    return false;
  }
  *until_ns = reply.a;
  return true;
}

bool BrokeredTurns::HoldsDevice(int d) const {
  if (d < 0 || d >= static_cast<int>(kMaxDevices)) return false;
  const std::uint32_t me = __atomic_load_n(&tenant_index_plus1_, __ATOMIC_ACQUIRE);
  const std::int32_t remote = __atomic_load_n(&known_[d].remote, __ATOMIC_ACQUIRE);
  return me != 0 && remote >= 0 && __atomic_load_n(&layout_->devices[remote].holder, __ATOMIC_ACQUIRE) == me;
}

std::uint64_t BrokeredTurns::HoldUntil(int d) const {
  if (d < 0 || d >= static_cast<int>(kMaxDevices)) return 0;
  const std::int32_t remote = __atomic_load_n(&known_[d].remote, __ATOMIC_ACQUIRE);
  return remote >= 0 ? __atomic_load_n(&layout_->devices[remote].hold_until_ns, __ATOMIC_ACQUIRE) : 0;
}

bool BrokeredTurns::SharesWant(int d, std::uint64_t now_ns, std::uint64_t period_ns) const {
  if (d < 0 || d >= static_cast<int>(kMaxDevices)) return false;
  const Known& k = known_[d];
  std::int32_t at = __atomic_load_n(&k.mark, __ATOMIC_ACQUIRE);
  if (at < 0) {
    for (std::uint32_t i = 0; i < kMaxDevices && at < 0; ++i)
      if (__atomic_load_n(&layout_->devices[i].in_use, __ATOMIC_ACQUIRE) &&
          std::memcmp(layout_->devices[i].uuid, k.uuid, 16) == 0)
        at = static_cast<std::int32_t>(i);
    if (at < 0) return false;
    __atomic_store_n(&k.mark, at, __ATOMIC_RELEASE);
  }
  const std::uint64_t wanted = __atomic_load_n(&layout_->devices[at].shares_wanted_ns, __ATOMIC_ACQUIRE);
  return wanted != 0 && now_ns < wanted + period_ns;
}

void BrokeredTurns::ReleaseDevice(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_running) {
  std::lock_guard<std::mutex> lock(mu_);
  // Without the agent there is nothing to give back: it gave our turns
  // back when our connection closed.
  if (!Served(d)) return;
  TurnsRequest request = NewRequest(TurnsOp::kRelease, known_[d].remote);
  request.a = now_ns;
  request.b = period_ns;
  request.flag = work_running;
  TurnsReply reply{};
  (void)Call(request, &reply);
}

void BrokeredTurns::ChargeOverrun(int d, std::uint64_t released_ns, std::uint64_t done_ns,
                                  std::uint64_t waited_at_release, std::uint64_t period_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Served(d)) return;
  TurnsRequest request = NewRequest(TurnsOp::kOverrun, known_[d].remote);
  request.a = released_ns;
  request.b = done_ns;
  request.c = waited_at_release;
  request.d = period_ns;
  TurnsReply reply{};
  (void)Call(request, &reply);
}

std::uint64_t BrokeredTurns::WaitedNs(std::uint64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) return 0;
  TurnsRequest request = NewRequest(TurnsOp::kWaited);
  request.a = now_ns;
  TurnsReply reply{};
  return Call(request, &reply) ? reply.a : 0;
}

bool BrokeredTurns::ExtendTurn(int d, std::uint64_t now_ns, std::uint64_t period_ns, bool work_conserving,
                               std::uint64_t* until_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!Served(d)) return false;
  TurnsRequest request = NewRequest(TurnsOp::kExtend, known_[d].remote);
  request.a = now_ns;
  request.b = period_ns;
  request.flag = work_conserving;
  TurnsReply reply{};
  if (!Call(request, &reply) || !reply.ok) return false;
  *until_ns = reply.a;
  return true;
}

std::uint64_t BrokeredTurns::BudgetWait(int d, std::uint64_t now_ns, std::uint64_t /*period_ns*/) {
  // What the agent said with its last refusal (no round trip).
  std::lock_guard<std::mutex> lock(mu_);
  if (!Served(d)) return 0;
  return known_[d].budget_ready_ns > now_ns ? known_[d].budget_ready_ns - now_ns : 0;
}

void BrokeredTurns::Unregister() {
  std::lock_guard<std::mutex> lock(mu_);
  refused_ = true;  // leaving for good: the agent gives our turns back as the connection closes
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  __atomic_store_n(&tenant_index_plus1_, 0u, __ATOMIC_RELEASE);
}

void BrokeredTurns::DetachAfterFork() {
  // The parent's connection is the parent's: the child closes its copy
  // (async-signal-safe) and asks for a place of its own when it needs one.
  // Another thread of the parent may have held mu_ at the fork: the child's
  // copy starts over.
  new (&mu_) std::mutex();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  __atomic_store_n(&tenant_index_plus1_, 0u, __ATOMIC_RELEASE);
  for (std::uint32_t i = 0; i < known_count_; ++i) {
    __atomic_store_n(&known_[i].remote, -1, __ATOMIC_RELEASE);
    known_[i].waiting = false;
    known_[i].budget_ready_ns = 0;
  }
  next_attempt_ns_ = 0;
}

bool BrokeredTurns::ReopenAfterFork(std::string* error) {
  std::lock_guard<std::mutex> lock(mu_);
  (void)Ready(error);
  return !refused_;
}

}  // namespace stoker::share
