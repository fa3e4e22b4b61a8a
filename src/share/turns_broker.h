// The node agent's compute schedule (`stoker gpu agent`, and the device
// plugin on Kubernetes nodes): the only process that writes the node's
// `turns` file. Processes under the interposer ask it for turns over a Unix
// socket (turns_protocol.h) and read whose turn it is from a read-only
// mapping of the file, so no user can change another's shares, budgets or
// turns, or wedge the schedule's lock.
//
// Each connection is one process: the broker opens the schedule for it and
// holds its slot, registered under the tenant the kernel vouches for
// (SO_PEERCRED; see turns_protocol.h), until the connection closes, which
// the kernel does when the process dies: its turns are then given back as
// when a process holding the file dies. One thread serves every
// connection; each call is a few microseconds under the schedule's lock,
// and a process that stops reading its replies is dropped, never waited on.
//
// Plain C++ and the C library (share_core); the agent and the device
// plugin start it through stoker/gpu_share.h.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace stoker::share {

class Ledger;
struct TurnsReply;
struct TurnsRequest;

// One process's conversation with the broker: what its requests do to the
// schedule. Apart from the socket so that it can be fuzzed (every byte of
// a request comes from a process the agent does not trust).
class TurnsSession {
 public:
  TurnsSession(std::string turns_path, std::string limits_dir, uid_t uid, pid_t pid);
  ~TurnsSession();
  TurnsSession(const TurnsSession&) = delete;
  TurnsSession& operator=(const TurnsSession&) = delete;
  // Carries out `request` (with `passed_fd`, a descriptor that came with
  // it, or -1; not taken) at `now_ns`, filling `*reply`. False: the
  // connection is to be closed (after the reply, when one is due), with
  // `*refusal` naming why when an operator should hear of it.
  bool Handle(const TurnsRequest& request, int passed_fd, std::uint64_t now_ns, TurnsReply* reply,
              std::string* refusal);
  // Gives this process's place in the schedule back.
  void Close();
  [[nodiscard]] const std::string& tenant() const { return tenant_; }

 private:
  std::string turns_path_, limits_dir_;
  uid_t uid_;
  pid_t pid_;
  std::unique_ptr<Ledger> ledger_;  // opened at kHello
  std::string tenant_;
};

class TurnsBroker {
 public:
  // A user's processes served at once by default (the schedule has
  // kMaxSlots places for every user together).
  static constexpr std::size_t kMaxClientsPerUid = 1024;
  struct Options {
    std::string turns_path;   // the schedule: made root's and 0644 if missing or writable by others
    std::string socket_path;  // made 0666: anyone may ask (the kernel says who asks)
    // Where the device plugin writes pinned limits, "<dir>/<tenant>.compute":
    // a process that passes that file may use the bare tenant name (a
    // container's grant). Empty: names always carry the caller's uid (a
    // file passed changes nothing).
    std::string limits_dir;
    std::function<void(const std::string&)> log;  // one line per event worth an operator's eye; may be empty
    // A user's processes served at once; one over it waits for a place.
    std::size_t max_clients_per_uid = kMaxClientsPerUid;
  };
  // Prepares the schedule and the socket and starts serving. Null with
  // `*error` when either cannot be made.
  static std::unique_ptr<TurnsBroker> Start(const Options& options, std::string* error);
  ~TurnsBroker();  // stops serving; every connection closes (their processes' launches wait for a new broker)
  TurnsBroker(const TurnsBroker&) = delete;
  TurnsBroker& operator=(const TurnsBroker&) = delete;

  // Connections being served now.
  [[nodiscard]] std::size_t clients() const { return clients_.load(std::memory_order_relaxed); }

 private:
  explicit TurnsBroker(Options options) : options_(std::move(options)) {}
  void Serve();

  Options options_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe: written to stop the thread
  std::atomic<std::size_t> clients_{0};
  std::thread thread_;
};

}  // namespace stoker::share
