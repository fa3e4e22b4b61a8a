// GPU sharing in Kubernetes (docs/gpu-sharing.md, "Kubernetes"): the device
// plugin each GPU node runs (a DaemonSet), and the kube-scheduler extender
// that places pods by memory and by card across nodes. `stoker gpu
// device-plugin` and `stoker gpu scheduler-extender` run them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "stoker/gpu_place.h"
#include "stoker/status.h"

namespace stoker {

struct GpuDevicePluginSettings {
  // "shared": stoker.io/gpu-memory (in units of memory_unit) and
  // stoker.io/gpu-compute (percent); "whole": stoker.io/gpu (cards).
  bool whole_cards = false;
  std::uint64_t memory_unit = std::uint64_t{1} << 30;
  GpuPolicy policy = GpuPolicy::kBinpack;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::string status_address = "0.0.0.0:9453";  // GET /cards for the extender; empty: off
  std::string node_name;                        // default: $NODE_NAME, else the host name
  std::string interposer_host_dir = "/opt/stoker/lib";
  std::string interposer_container_dir = "/usr/local/stoker";
  std::string ledger_host_dir = "/run/stoker";       // the node's GPU state: tenants' folders, limits, turns
  std::string ledger_container_dir = "/run/stoker";  // where a container sees its tenant's folder
  std::string turns_container_path = "/run/stoker-turns";
  bool enforce_preload = false;  // mount /etc/ld.so.preload naming the interposer into every container
  double health_interval_seconds = 5;
  // The state of ended containers (tenant folders, pinned limits) is swept
  // this often (0: never), once the kubelet no longer lists them and it is
  // older than the grace period.
  double tenant_sweep_seconds = 60;
  double tenant_grace_seconds = 300;
};
// Serves until `stop()` is true (polled every 200 ms); logs to stderr.
// In the stoker_kube_plugin library (it links gRPC), not in `stoker`.
[[nodiscard]] Status RunGpuDevicePlugin(const GpuDevicePluginSettings& settings, const std::function<bool()>& stop);

struct GpuExtenderSettings {
  std::string listen = "0.0.0.0:8888";  // POST /filter, POST /prioritize, GET /healthz
  GpuPolicy policy = GpuPolicy::kBinpack;
  // Where each node's card state is: {node} and {address} (its InternalIP,
  // or the node name when the scheduler sends names only) are replaced.
  std::string node_url = "http://{address}:9453/cards";
  double fetch_timeout_seconds = 2;
  double cache_seconds = 1;  // filter and prioritize of one pod share a fetch
};
[[nodiscard]] Status RunGpuSchedulerExtender(const GpuExtenderSettings& settings, const std::function<bool()>& stop);

}  // namespace stoker
