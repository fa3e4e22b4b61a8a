// The Kubernetes device plugin: one gRPC server per advertised resource on
// a Unix socket in the kubelet's folder, registered with the kubelet, that
// lists the node's cards as devices (re-read every health interval; a card
// that fails or disappears turns Unhealthy), prefers devices on one card by
// the placement policy, and grants containers the environment and mounts
// that hold them to what they were given (kube/plugin_devices.h). When the
// kubelet restarts it deletes the sockets; the plugin notices, serves anew
// and registers again. It also serves the node's card state over HTTP
// (GET /cards) for the scheduler extender, counting what is allocated from
// the kubelet's pod-resources API.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kube/plugin_devices.h"
#include "stoker/gpu_place.h"
#include "stoker/status.h"

namespace stoker::kube {

struct DevicePluginOptions {
  PluginSettings settings;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string pod_resources_socket = "/var/lib/kubelet/pod-resources/kubelet.sock";
  std::string status_address = "0.0.0.0:9453";  // empty: no HTTP endpoint
  std::string node_name;                        // reported in /cards
  double health_interval_seconds = 5;
  // How often the host state of ended containers is swept (their tenant
  // folders and pinned limits, kube/tenant_sweep.h; 0: never), and how long
  // a grant's state is kept before the kubelet must list its container.
  double tenant_sweep_seconds = 60;
  double tenant_grace_seconds = 300;
  std::function<Result<GpuInventory>()> inventory = ReadGpuInventory;
  std::function<void(const std::string&)> log = [](const std::string&) {};
};

class DevicePlugin {
 public:
  // Reads the inventory, serves and registers every resource. Fails (naming
  // the socket and what the kubelet said) if any registration fails.
  [[nodiscard]] static Result<std::unique_ptr<DevicePlugin>> Start(DevicePluginOptions options);
  ~DevicePlugin();
  DevicePlugin(const DevicePlugin&) = delete;
  DevicePlugin& operator=(const DevicePlugin&) = delete;

  // The status endpoint's port (0: none).
  [[nodiscard]] int status_port() const;
  // The node's card state as GET /cards returns it (JSON).
  [[nodiscard]] Result<std::string> CardsJson();

  class Impl;

 private:
  explicit DevicePlugin(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::kube
