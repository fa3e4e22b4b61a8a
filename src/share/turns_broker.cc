#include "share/turns_broker.h"

#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "share/ledger.h"
#include "share/ledger_internal.h"
#include "share/share_config.h"
#include "share/turns_protocol.h"

namespace stoker::share {
namespace {

// A period a process asks for, held to what the schedule was made for: a
// client cannot stretch its turns by naming a longer one.
std::uint64_t ClampPeriod(std::uint64_t period_ns) {
  return std::clamp<std::uint64_t>(period_ns, 1'000'000, 10'000'000'000);
}

struct Client {
  int fd = -1;
  uid_t uid = 0;
  pid_t pid = 0;
  std::unique_ptr<TurnsSession> session;
};

void CopyError(TurnsReply* reply, const std::string& text) {
  std::snprintf(reply->error, sizeof(reply->error), "%s", text.c_str());
}

// The tenant `request` may act as, or empty with `*error`.
std::string TenantFor(uid_t uid, const TurnsRequest& request, int proof_fd, const std::string& limits_dir,
                      std::string* error) {
  char name_buffer[kTenantNameBytes];
  std::memcpy(name_buffer, request.tenant, sizeof(name_buffer));
  name_buffer[sizeof(name_buffer) - 1] = '\0';
  const std::string name = name_buffer;
  if (!ValidTenantName(name)) {
    *error = "tenant '" + name + "' must be 1-63 characters of A-Z a-z 0-9 . _ -";
    return "";
  }
  // An agent that keeps no pinned limits (bare metal) vouches for no bare
  // name: a pinned file passed to it changes nothing.
  if (proof_fd < 0 || limits_dir.empty()) return name + "@uid" + std::to_string(uid);
  // The bare name: only for the process that can show the pinned limits
  // file written for that tenant (the container it was mounted into).
  struct stat passed {
  }, pinned{};
  const std::string path = limits_dir + "/" + name + ".compute";
  if (::fstat(proof_fd, &passed) != 0 || ::stat(path.c_str(), &pinned) != 0 || !S_ISREG(passed.st_mode) ||
      passed.st_dev != pinned.st_dev || passed.st_ino != pinned.st_ino) {
    *error = "the pinned limits file this process passed is not tenant '" + name + "'s (" + path + ")";
    return "";
  }
  return name;
}

}  // namespace

TurnsSession::TurnsSession(std::string turns_path, std::string limits_dir, uid_t uid, pid_t pid)
    : turns_path_(std::move(turns_path)), limits_dir_(std::move(limits_dir)), uid_(uid), pid_(pid) {}

TurnsSession::~TurnsSession() {
  Close();
}

void TurnsSession::Close() {
  if (ledger_ != nullptr) ledger_->Unregister();
  ledger_.reset();
}

bool TurnsSession::Handle(const TurnsRequest& request, int passed_fd, std::uint64_t now, TurnsReply* out,
                          std::string* refusal) {
  TurnsReply& reply = *out;
  reply = TurnsReply{};
  reply.version = kTurnsProtocolVersion;
  const auto op = static_cast<TurnsOp>(request.op);
  const int d = request.device;
  if (request.version != kTurnsProtocolVersion) {
    CopyError(&reply, "the GPU agent speaks version " + std::to_string(kTurnsProtocolVersion) +
                          " of the compute schedule's protocol, this process version " +
                          std::to_string(request.version) + ": run the agent and the jobs from one stoker release");
    return false;
  }
  if (op == TurnsOp::kHello) {
    std::string error = "this connection already said hello";
    const std::string tenant = ledger_ == nullptr ? TenantFor(uid_, request, passed_fd, limits_dir_, &error) : "";
    if (!tenant.empty()) {
      LedgerFile file;
      file.mode = 0644;
      std::unique_ptr<Ledger> ledger(Ledger::Open(turns_path_, &error, file));
      if (ledger != nullptr &&
          ledger->Register(tenant, static_cast<std::uint32_t>(std::min<std::uint64_t>(request.a, 100)), &error, pid_)) {
        ledger_ = std::move(ledger);
        tenant_ = tenant;
        reply.ok = 1;
        reply.value = static_cast<std::int32_t>(ledger_->tenant_index());
        return true;
      }
    }
    CopyError(&reply, error);
    *refusal = error;
    return false;
  }
  if (ledger_ == nullptr) return false;  // every call comes after a hello
  if (op != TurnsOp::kDevice && op != TurnsOp::kWaited && (d < 0 || d >= static_cast<std::int32_t>(kMaxDevices))) {
    CopyError(&reply, "no device " + std::to_string(d) + " in the compute schedule");
    return false;
  }
  Ledger& ledger = *ledger_;
  switch (op) {
    case TurnsOp::kDevice:
      reply.value = ledger.Device(request.uuid, request.a);
      reply.ok = reply.value >= 0;
      if (!reply.ok) CopyError(&reply, "the compute schedule has no room for another device");
      return true;
    case TurnsOp::kSetShare: {
      std::string error;
      reply.ok = ledger.SetComputeShare(d, static_cast<std::uint32_t>(std::min<std::uint64_t>(request.a, 100)), &error);
      if (!reply.ok) CopyError(&reply, error);
      return true;
    }
    case TurnsOp::kAcquire:
      reply.ok = ledger.AcquireDevice(d, now, ClampPeriod(request.b), &reply.a, request.flag != 0);
      if (!reply.ok) reply.a = ledger.BudgetWait(d, now, ClampPeriod(request.b));  // how long asking again is pointless
      return true;
    case TurnsOp::kRelease:
      ledger.ReleaseDevice(d, now, ClampPeriod(request.b), request.flag != 0);
      reply.ok = 1;
      return true;
    case TurnsOp::kExtend:
      reply.ok = ledger.ExtendTurn(d, now, ClampPeriod(request.b), request.flag != 0, &reply.a);
      return true;
    case TurnsOp::kBudgetWait:
      reply.a = ledger.BudgetWait(d, now, ClampPeriod(request.b));
      reply.ok = 1;
      return true;
    case TurnsOp::kWaited:
      reply.a = ledger.WaitedNs(now);
      reply.ok = 1;
      return true;
    case TurnsOp::kOverrun: {
      // The process's clock is the agent's (CLOCK_MONOTONIC), but never a
      // time still to come.
      const std::uint64_t released = std::min(request.a, now), done = std::min(request.b, now);
      ledger.ChargeOverrun(d, released, std::max(done, released), request.c, ClampPeriod(request.d));
      reply.ok = 1;
      return true;
    }
    default:
      return false;
  }
}

std::unique_ptr<TurnsBroker> TurnsBroker::Start(const Options& options, std::string* error) {
  std::unique_ptr<TurnsBroker> broker(new TurnsBroker(options));
  // The schedule: made if missing, then writable by its owner (root) only.
  {
    LedgerFile file;
    file.mode = 0644;
    std::unique_ptr<Ledger> probe(Ledger::Open(options.turns_path, error, file));
    if (probe == nullptr) return nullptr;
    if (::chown(options.turns_path.c_str(), ::geteuid(), ::getegid()) != 0 ||
        ::chmod(options.turns_path.c_str(), 0644) != 0) {
      *error = internal::Errno("making the compute schedule writable by its owner only:", options.turns_path);
      return nullptr;
    }
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (options.socket_path.size() >= sizeof(address.sun_path)) {
    *error = "the socket path '" + options.socket_path + "' is too long for a Unix socket";
    return nullptr;
  }
  std::memcpy(address.sun_path, options.socket_path.c_str(), options.socket_path.size() + 1);
  broker->listen_fd_ = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (broker->listen_fd_ < 0) {
    *error = internal::Errno("making a socket for", options.socket_path);
    return nullptr;
  }
  // A socket left by an agent that ended: replaced (a live agent's too: the
  // newest one serves).
  struct stat st {};
  if (::lstat(options.socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      *error = "'" + options.socket_path + "' exists and is not a socket: remove it";
      return nullptr;
    }
    ::unlink(options.socket_path.c_str());
  }
  if (::bind(broker->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::chmod(options.socket_path.c_str(), 0666) != 0 || ::listen(broker->listen_fd_, 128) != 0) {
    *error = internal::Errno("listening on", options.socket_path);
    return nullptr;
  }
  if (::pipe2(broker->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = internal::Errno("making a pipe for", options.socket_path);
    return nullptr;
  }
  // Two descriptors per process served (its socket, its schedule's file).
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < 2 * kMaxSlots + 64) {
    limit.rlim_cur = std::min<rlim_t>(limit.rlim_max, 2 * kMaxSlots + 64);
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
  broker->thread_ = std::thread([b = broker.get()] { b->Serve(); });
  return broker;
}

TurnsBroker::~TurnsBroker() {
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!::write(wake_[1], &byte, 1);
    thread_.join();
  }
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    // Only our own socket: a newer agent may have replaced it.
    struct stat st {};
    if (::lstat(options_.socket_path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) ::unlink(options_.socket_path.c_str());
  }
  for (int fd : wake_)
    if (fd >= 0) ::close(fd);
}

void TurnsBroker::Serve() {
  auto log = [this](const std::string& line) {
    if (options_.log) options_.log(line);
  };
  // epoll, not poll: a round costs the connections with a message, not
  // every connection (a thousand processes made each round trip walk them
  // all). Level-triggered, at most kBatch a round: each connection with a
  // message gets one served per round, so none can starve the others.
  constexpr int kBatch = 256;
  const int epoll_fd = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) {
    log(internal::Errno("making an epoll set for", options_.socket_path));
    return;
  }
  auto watch = [&](int fd) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.fd = fd;
    return ::epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event) == 0;
  };
  if (!watch(wake_[0]) || !watch(listen_fd_)) {
    log(internal::Errno("watching", options_.socket_path));
    ::close(epoll_fd);
    return;
  }
  std::unordered_map<int, Client> clients;  // by socket
  std::unordered_map<uid_t, std::size_t> of_uid;
  auto drop = [&](int fd) {
    auto it = clients.find(fd);
    if (it == clients.end()) return;
    it->second.session->Close();
    if (--of_uid[it->second.uid] == 0) of_uid.erase(it->second.uid);
    ::close(fd);  // (leaves the epoll set with it)
    clients.erase(it);
    clients_.store(clients.size(), std::memory_order_relaxed);
  };
  epoll_event events[kBatch];
  bool stopping = false;
  while (!stopping) {
    const int ready = ::epoll_wait(epoll_fd, events, kBatch, -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      log(internal::Errno("waiting on", options_.socket_path));
      break;
    }
    for (int e = 0; e < ready; ++e) {
      const int fd = events[e].data.fd;
      if (fd == wake_[0]) {
        stopping = true;
        break;
      }
      if (fd == listen_fd_) {
        for (;;) {
          const int accepted = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
          if (accepted < 0) break;
          ucred cred{};
          socklen_t length = sizeof(cred);
          const bool known = ::getsockopt(accepted, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0;
          const auto uid_count = known && of_uid.count(cred.uid) ? of_uid[cred.uid] : 0;
          if (!known || clients.size() >= kMaxSlots || uid_count >= options_.max_clients_per_uid) {
            // One user cannot take every place in the schedule from the others.
            if (known && clients.size() < kMaxSlots)
              log("refused a connection of uid " + std::to_string(cred.uid) + ": it has " +
                  std::to_string(options_.max_clients_per_uid) + " already");
            ::close(accepted);
            continue;
          }
          if (!watch(accepted)) {
            log(internal::Errno("watching a connection to", options_.socket_path));
            ::close(accepted);
            continue;
          }
          clients.emplace(accepted, Client{accepted, cred.uid, cred.pid,
                                           std::make_unique<TurnsSession>(options_.turns_path, options_.limits_dir,
                                                                          cred.uid, cred.pid)});
          ++of_uid[cred.uid];
        }
        clients_.store(clients.size(), std::memory_order_relaxed);
        continue;
      }
      auto it = clients.find(fd);
      if (it == clients.end()) continue;  // dropped earlier this round
      Client& client = it->second;
      TurnsRequest request{};
      iovec io{&request, sizeof(request)};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
      msghdr message{};
      message.msg_iov = &io;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof(control);
      const ssize_t n = ::recvmsg(client.fd, &message, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
      int passed_fd = -1;
      for (cmsghdr* c = CMSG_FIRSTHDR(&message); c != nullptr; c = CMSG_NXTHDR(&message, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
          std::memcpy(&passed_fd, CMSG_DATA(c), sizeof(int));
      if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (n != static_cast<ssize_t>(sizeof(request)) || (message.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        if (passed_fd >= 0) ::close(passed_fd);
        drop(fd);  // closed (the process ended), or not our protocol
        continue;
      }
      TurnsReply reply{};
      std::string refusal;
      bool keep = client.session->Handle(request, passed_fd, internal::NowMonotonicNs(), &reply, &refusal);
      if (!refusal.empty())
        log("refused pid " + std::to_string(client.pid) + " (uid " + std::to_string(client.uid) + "): " + refusal);
      if (passed_fd >= 0) ::close(passed_fd);
      // A process that does not read its replies is not waited on.
      if (::send(client.fd, &reply, sizeof(reply), MSG_DONTWAIT | MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(reply)))
        keep = false;
      if (!keep) drop(fd);
    }
  }
  while (!clients.empty()) drop(clients.begin()->first);
  ::close(epoll_fd);
}

}  // namespace stoker::share
