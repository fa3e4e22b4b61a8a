// `stoker gpu device-plugin` and `stoker gpu scheduler-extender`: the
// Kubernetes side of GPU sharing, running until SIGTERM or SIGINT.
#include <csignal>

#include <atomic>

#include <fmt/format.h>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/gpu_kube.h"

namespace stoker_cli {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  g_stop = true;
}

void StopOnSignals() {
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

}  // namespace

int RunGpuDevicePluginCommand(const GpuDevicePluginArgs& args) {
  stoker::GpuDevicePluginSettings s;
  if (args.mode != "shared" && args.mode != "whole")
    return Fail(stoker::Status::InvalidArgument(fmt::format("--mode '{}': use shared or whole", args.mode)));
  s.whole_cards = args.mode == "whole";
  auto unit = stoker::ParseByteSize(args.memory_unit);
  if (!unit.ok()) return Fail(unit.error().WithContext("--memory-unit"));
  s.memory_unit = *unit;
  auto policy = stoker::ParseGpuPolicy(args.policy);
  if (!policy.ok()) return Fail(policy.error().WithContext("--policy"));
  s.policy = *policy;
  s.kubelet_dir = args.kubelet_dir;
  s.pod_resources_socket = args.pod_resources_socket;
  s.status_address = args.status_address;
  s.node_name = args.node_name;
  s.interposer_host_dir = args.interposer_host_dir;
  s.interposer_container_dir = args.interposer_container_dir;
  s.ledger_host_dir = args.ledger_host_dir;
  s.ledger_container_dir = args.ledger_container_dir;
  s.health_interval_seconds = args.health_interval;
  StopOnSignals();
  const stoker::Status status = stoker::RunGpuDevicePlugin(s, [] { return g_stop.load(); });
  return status.ok() ? 0 : Fail(status);
}

int RunGpuExtenderCommand(const GpuExtenderArgs& args) {
  stoker::GpuExtenderSettings s;
  s.listen = args.listen;
  auto policy = stoker::ParseGpuPolicy(args.policy);
  if (!policy.ok()) return Fail(policy.error().WithContext("--policy"));
  s.policy = *policy;
  s.node_url = args.node_url;
  s.fetch_timeout_seconds = args.fetch_timeout;
  s.cache_seconds = args.cache_seconds;
  StopOnSignals();
  const stoker::Status status = stoker::RunGpuSchedulerExtender(s, [] { return g_stop.load(); });
  return status.ok() ? 0 : Fail(status);
}

}  // namespace stoker_cli
