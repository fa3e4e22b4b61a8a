// The device plugin's public face (stoker/gpu_kube.h): serving until told to
// stop. Built with gRPC into stoker_kube_plugin, apart from the layer, so
// that the stoker CLI and the Python module do not load gRPC.
#include <unistd.h>

#include <fmt/format.h>

#include "kube/device_plugin.h"
#include "kube/run_util.h"
#include "stoker/gpu_kube.h"

namespace stoker {
namespace {

std::string HostName() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

}  // namespace

Status RunGpuDevicePlugin(const GpuDevicePluginSettings& settings, const std::function<bool()>& stop) {
  kube::DevicePluginOptions options;
  options.settings.whole_cards = settings.whole_cards;
  options.settings.memory_unit = settings.memory_unit;
  options.settings.policy = settings.policy;
  options.settings.interposer_host_dir = settings.interposer_host_dir;
  options.settings.interposer_container_dir = settings.interposer_container_dir;
  options.settings.ledger_host_dir = settings.ledger_host_dir;
  options.settings.ledger_container_dir = settings.ledger_container_dir;
  options.settings.turns_container_path = settings.turns_container_path;
  options.settings.enforce_preload = settings.enforce_preload;
  options.kubelet_dir = settings.kubelet_dir;
  options.pod_resources_socket = settings.pod_resources_socket;
  options.status_address = settings.status_address;
  const char* env_node = std::getenv("NODE_NAME");
  options.node_name =
      !settings.node_name.empty() ? settings.node_name : (env_node && *env_node ? env_node : HostName());
  if (!(settings.health_interval_seconds > 0))
    return Status::InvalidArgument("the health interval must be above zero seconds");
  options.health_interval_seconds = settings.health_interval_seconds;
  if (settings.tenant_sweep_seconds < 0 || settings.tenant_grace_seconds < 0)
    return Status::InvalidArgument("the tenant sweep interval and grace period must not be negative");
  options.tenant_sweep_seconds = settings.tenant_sweep_seconds;
  options.tenant_grace_seconds = settings.tenant_grace_seconds;
  options.log = [](const std::string& line) { kube::Log("device-plugin", line); };
  auto plugin = kube::DevicePlugin::Start(std::move(options));
  if (!plugin.ok()) return plugin.error();
  if ((*plugin)->status_port())
    kube::Log("device-plugin", fmt::format("card state at http://{}/cards (port {})", settings.status_address,
                                           (*plugin)->status_port()));
  kube::WaitUntil(stop);
  kube::Log("device-plugin", "stopping");
  return Status::Ok();
}

}  // namespace stoker
