// What the node agent's turns broker costs a process under a compute share,
// against the shared file it replaces (both in this process, on /dev/shm):
//  - a turn taken and given back (AcquireDevice + ReleaseDevice), once per
//    turn: a round trip to the agent each, against a lock on the file;
//  - HoldsDevice, on every launch inside a turn: a load from the mapping
//    either way;
//  - with CLIENTS other processes asking at once (threads, a connection
//    each), a turn's round trips as one process sees them;
//  - with RESIDENT processes connected, what one more process arriving
//    (connect, hello, its device) and leaving costs the agent's one thread.
// Usage: stoker_turns_bench [ITERATIONS] [CLIENTS] [RESIDENT]
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "share/brokered_turns.h"
#include "share/ledger.h"
#include "share/turns_broker.h"

namespace share = stoker::share;

namespace {

constexpr std::uint64_t kPeriodNs = 100'000'000;
constexpr std::uint8_t kCard[16] = {7};

std::uint64_t Now() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Nanoseconds per Acquire + Release and per HoldsDevice, best of 5 rounds.
std::pair<double, double> Measure(share::TurnSchedule& turns, int d, int iterations) {
  double cycle = 1e18, holds = 1e18;
  for (int round = 0; round < 5; ++round) {
    std::uint64_t t = Now();
    for (int i = 0; i < iterations; ++i) {
      std::uint64_t until = 0;
      if (!turns.AcquireDevice(d, Now(), kPeriodNs, &until, true)) {
        std::fprintf(stderr, "a lone tenant was refused a turn\n");
        std::exit(1);
      }
      turns.ReleaseDevice(d, Now(), kPeriodNs, false);
    }
    cycle = std::min(cycle, static_cast<double>(Now() - t) / iterations);
    std::uint64_t until = 0;
    (void)turns.AcquireDevice(d, Now(), kPeriodNs, &until, true);
    t = Now();
    std::uint64_t held = 0;
    for (int i = 0; i < iterations * 100; ++i) held += turns.HoldsDevice(d);
    holds = std::min(holds, static_cast<double>(Now() - t) / (iterations * 100.0));
    if (held == 0) std::exit(1);
    turns.ReleaseDevice(d, Now(), kPeriodNs, false);
  }
  return {cycle, holds};
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 20000;
  const int others = argc > 2 ? std::atoi(argv[2]) : 8;
  const int resident = argc > 3 ? std::atoi(argv[3]) : 1000;
  const std::string dir = "/dev/shm/stoker-turns-bench-" + std::to_string(::getpid());
  (void)std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::string error;
  {
    share::LedgerFile shared;
    shared.mode = 0666;
    std::unique_ptr<share::Ledger> file(share::Ledger::Open(dir + "/shared", &error, shared));
    if (!file || !file->Register("bench@uid0", 50, &error)) {
      std::fprintf(stderr, "%s\n", error.c_str());
      return 1;
    }
    const int d = file->Device(kCard, 1ull << 30);
    (void)file->SetComputeShare(d, 50, &error);
    const auto [cycle, holds] = Measure(*file, d, iterations);
    std::printf("shared file: a turn taken and given back %.2f us; HoldsDevice %.1f ns\n", cycle / 1e3, holds);
  }
  share::TurnsBroker::Options options;
  options.turns_path = dir + "/turns";
  options.socket_path = dir + "/turns.sock";
  options.max_clients_per_uid = static_cast<std::size_t>(resident) + 64;
  auto broker = share::TurnsBroker::Start(options, &error);
  if (!broker) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  share::BrokeredTurns::Options o;
  o.socket_path = options.socket_path;
  o.turns_path = options.turns_path;
  o.tenant = "bench";
  o.compute_share = 50;
  std::unique_ptr<share::BrokeredTurns> turns(share::BrokeredTurns::Open(o, &error));
  if (!turns) {
    std::fprintf(stderr, "%s\n", error.c_str());
    return 1;
  }
  const int d = turns->Device(kCard, 1ull << 30);
  (void)turns->SetComputeShare(d, 50, &error);
  auto [cycle, holds] = Measure(*turns, d, iterations);
  std::printf("through the agent: a turn taken and given back %.2f us; HoldsDevice %.1f ns\n", cycle / 1e3, holds);
  // Other processes asking the agent all the time (tenants of their own,
  // waiting for a device this one does not use).
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < others; ++i)
    threads.emplace_back([&, i] {
      share::BrokeredTurns::Options other = o;
      other.tenant = "other" + std::to_string(i);
      std::string e;
      std::unique_ptr<share::BrokeredTurns> t(share::BrokeredTurns::Open(other, &e));
      if (!t) return;
      const std::uint8_t card[16] = {static_cast<std::uint8_t>(100 + i)};
      const int od = t->Device(card, 1ull << 30);
      (void)t->SetComputeShare(od, 50, &e);
      while (!stop.load(std::memory_order_relaxed)) {
        std::uint64_t until = 0;
        if (t->AcquireDevice(od, Now(), kPeriodNs, &until, true)) t->ReleaseDevice(od, Now(), kPeriodNs, false);
      }
    });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::tie(cycle, holds) = Measure(*turns, d, iterations / 4);
  stop = true;
  for (auto& t : threads) t.join();
  std::printf("through the agent, %d other processes asking nonstop: a turn taken and given back %.2f us\n", others,
              cycle / 1e3);
  // Processes arriving and leaving beside RESIDENT connected ones (each
  // arrival waits for the agent to have served the last departure: one
  // thread serves both).
  std::vector<std::unique_ptr<share::BrokeredTurns>> connected;
  for (int i = 0; i < resident; ++i) {
    share::BrokeredTurns::Options r = o;
    r.tenant = "resident" + std::to_string(i % 64);
    connected.emplace_back(share::BrokeredTurns::Open(r, &error));
    if (!connected.back() || connected.back()->Device(kCard, 1ull << 30) < 0) {
      std::fprintf(stderr, "resident %d: %s\n", i, error.c_str());
      return 1;
    }
  }
  const int churn = 200;
  const std::uint64_t churn_start = Now();
  for (int i = 0; i < churn; ++i) {
    share::BrokeredTurns::Options c = o;
    c.tenant = "arriving" + std::to_string(i);
    std::unique_ptr<share::BrokeredTurns> arriving(share::BrokeredTurns::Open(c, &error));
    if (!arriving || arriving->Device(kCard, 1ull << 30) < 0) {
      std::fprintf(stderr, "arriving %d: %s\n", i, error.c_str());
      return 1;
    }
  }
  std::printf("through the agent, %d processes connected: one more arriving and leaving %.1f us\n", resident,
              static_cast<double>(Now() - churn_start) / churn / 1e3);
  connected.clear();
  turns.reset();
  broker.reset();
  (void)std::system(("rm -rf " + dir).c_str());
  return 0;
}
