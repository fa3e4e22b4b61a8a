// stoker-device-plugin: the Kubernetes device plugin (run as `stoker gpu
// device-plugin ...`, which execs this program). A program of its own
// because it links gRPC, which the stoker CLI does not load.
#include <csignal>

#include <algorithm>
#include <atomic>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli.h"
#include "stoker/byte_size.h"
#include "stoker/gpu_kube.h"

namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) {
  g_stop = true;
}

}  // namespace

int main(int argc, char** argv) {
  using stoker_cli::Fail;
  CLI::App app{
      "stoker gpu device-plugin: advertise this node's GPUs to the kubelet by memory and compute "
      "(stoker.io/gpu-memory, "
      "stoker.io/gpu-compute) or as whole cards (stoker.io/gpu); run as a DaemonSet (deploy/kubernetes)",
      "stoker gpu device-plugin"};
  stoker::GpuDevicePluginSettings s;
  std::string mode = "shared", memory_unit = "1GiB", policy = "binpack";
  app.add_option("--mode", mode, "shared (stoker.io/gpu-memory, stoker.io/gpu-compute) or whole (stoker.io/gpu)")
      ->capture_default_str();
  app.add_option("--memory-unit", memory_unit, "Bytes per stoker.io/gpu-memory unit")->capture_default_str();
  app.add_option("--policy", policy, "binpack or spread")->capture_default_str();
  app.add_option("--kubelet-dir", s.kubelet_dir, "The kubelet's device-plugin folder")->capture_default_str();
  app.add_option("--pod-resources-socket", s.pod_resources_socket,
                 "The kubelet's pod-resources API (what is allocated)")
      ->capture_default_str();
  app.add_option("--status-address", s.status_address,
                 "Where GET /cards serves the node's card state for the extender (empty: off)")
      ->capture_default_str();
  app.add_option("--node-name", s.node_name, "This node's name (default: $NODE_NAME, the host name)");
  app.add_option("--interposer-host-dir", s.interposer_host_dir, "Host folder holding libstoker-share.so")
      ->capture_default_str();
  app.add_option("--interposer-container-dir", s.interposer_container_dir, "Where containers see that folder")
      ->capture_default_str();
  app.add_option("--ledger-host-dir", s.ledger_host_dir,
                 "Host folder of the node's GPU state (tenants' ledgers, pinned limits, turns)")
      ->capture_default_str();
  app.add_option("--ledger-container-dir", s.ledger_container_dir, "Where a container sees its tenant's folder")
      ->capture_default_str();
  app.add_option("--turns-container-path", s.turns_container_path,
                 "Where a container with a compute share sees the node's schedule")
      ->capture_default_str();
  app.add_flag("--enforce-preload", s.enforce_preload,
               "Mount /etc/ld.so.preload naming the interposer into every container: its processes are held "
               "whatever their environment");
  app.add_option("--health-interval", s.health_interval_seconds, "Seconds between looks at the cards")
      ->capture_default_str();
  app.add_option("--tenant-sweep-interval", s.tenant_sweep_seconds,
                 "Seconds between sweeps of ended containers' tenant folders and pinned limits (0: never)")
      ->capture_default_str();
  app.add_option("--tenant-grace", s.tenant_grace_seconds,
                 "Seconds a grant's state is kept before the kubelet must list its container")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    return Fail(stoker::Status::InvalidArgument(fmt::format("{} (see 'stoker gpu device-plugin --help')", what)));
  }
  if (mode != "shared" && mode != "whole")
    return Fail(stoker::Status::InvalidArgument(fmt::format("--mode '{}': use shared or whole", mode)));
  s.whole_cards = mode == "whole";
  auto unit = stoker::ParseByteSize(memory_unit);
  if (!unit.ok()) return Fail(unit.error().WithContext("--memory-unit"));
  s.memory_unit = *unit;
  auto parsed_policy = stoker::ParseGpuPolicy(policy);
  if (!parsed_policy.ok()) return Fail(parsed_policy.error().WithContext("--policy"));
  s.policy = *parsed_policy;
  struct sigaction action {};
  action.sa_handler = OnSignal;
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  const stoker::Status status = stoker::RunGpuDevicePlugin(s, [] { return g_stop.load(); });
  return status.ok() ? 0 : Fail(status);
}
