// `stoker gpu agent`: the node's keeper of the GPU state folder (run by
// systemd on bare metal; the device plugin does the same for Kubernetes).
// It makes the folder root's and sticky before any user can squat it, keeps
// the compute schedule (the only writer of `turns`: processes ask it for
// turns over turns.sock), and watches: dead processes' charges go back
// at every look, every process a card lists that runs without the
// interposer is logged once as unlimited, and processes in containers are
// told their PIDs in the node's namespace (which NVML lists). Admission never waits on it: if
// the agent stops, quotas hold as before.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/gpu_place.h"
#include "stoker/gpu_share.h"

namespace stoker_cli {
namespace {

std::atomic<bool> g_agent_stop{false};

void Log(const std::string& line) {
  char when[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  fmt::print(stderr, "{} stoker gpu agent: {}\n", when, line);
}

}  // namespace

int RunGpuAgent(const GpuAgentArgs& args) {
  if (::geteuid() != 0)
    return Fail(stoker::Status::FailedPrecondition(
        "stoker gpu agent keeps the node's GPU state folder for every user: run it as root"));
  if (!(args.interval_seconds > 0))
    return Fail(stoker::Status::InvalidArgument("--interval must be above zero seconds"));
  if (!args.dir.empty()) ::setenv("STOKER_GPU_DIR", args.dir.c_str(), 1);
  ::unsetenv("STOKER_GPU_LEDGER");  // every user's ledger in the folder
  const std::string dir = stoker::GpuStateDir();
  auto changed = stoker::PrepareGpuStateDir(dir);
  if (!changed.ok()) return Fail(changed.error());
  for (const auto& line : *changed) Log(line);
  Log(fmt::format("keeping {}{}", dir, changed->empty() ? " (already in order)" : ""));
  if (args.once) {
    Log("compute shares take turns through the running agent: start `stoker gpu agent` without --once");
    return 0;
  }
  // The node's compute schedule: only this process writes it.
  stoker::GpuTurnsBrokerOptions turns;
  turns.turns_path = dir + "/turns";
  turns.socket_path = dir + "/turns.sock";
  turns.log = [](const std::string& line) { Log("turns: " + line); };
  auto broker = stoker::StartGpuTurnsBroker(turns);
  if (!broker.ok()) return Fail(broker.error());
  Log(fmt::format("compute turns served at {}", turns.socket_path));
  struct sigaction action {};
  action.sa_handler = [](int) { g_agent_stop = true; };
  ::sigaction(SIGTERM, &action, nullptr);
  ::sigaction(SIGINT, &action, nullptr);
  std::set<std::pair<int, std::string>> reported;  // (pid, card) logged as unlimited
  std::string last_summary;
  while (!g_agent_stop) {
    auto view = stoker::ReadGpuLedger();  // frees dead processes' slots and charges
    std::size_t processes = 0;
    if (view.ok()) {
      for (const auto& t : view->tenants) processes += t.processes.size();
      const std::string summary =
          fmt::format("{} tenant(s), {} process(es) under the interposer; locks taken over {} time(s), {} fenced",
                      view->tenants.size(), processes, view->repairs, view->fences);
      if (summary != last_summary) Log(summary);
      last_summary = summary;
    } else {
      Log("reading the ledgers: " + view.error().ToString());
    }
    if (auto inventory = stoker::ReadGpuInventory(); inventory.ok()) {
      // Containers' processes learn their PIDs here, which NVML lists.
      std::vector<int> pids;
      for (const auto& card : inventory->cards)
        for (const auto& p : card.processes) pids.push_back(p.pid);
      (void)stoker::RecordGpuHostPids(pids);
      std::set<std::pair<int, std::string>> seen;
      for (const auto& card : inventory->cards)
        for (const auto& p : card.processes) {
          const auto held = stoker::UnderGpuInterposer(p.pid);
          if (!held || *held) continue;
          seen.insert({p.pid, card.uuid});
          if (reported.insert({p.pid, card.uuid}).second)
            Log(fmt::format("pid {} uses {} on {} without the GPU interposer: unlimited", p.pid,
                            stoker::FormatBytes(p.used_bytes), card.uuid));
        }
      std::erase_if(reported, [&](const auto& r) { return !seen.count(r); });
    }
    for (double waited = 0; waited < args.interval_seconds && !g_agent_stop; waited += 0.1)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  broker->reset();  // processes under a compute share now wait for the next agent
  Log("stopped");
  return 0;
}

}  // namespace stoker_cli
