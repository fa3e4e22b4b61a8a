// What the device plugin tells the kubelet, as pure functions of the
// node's cards (so they are tested without gRPC): the devices of each
// extended resource, the preferred choice among free ones, and what a
// container gets for the devices allocated to it.
//
// Resources and their device IDs (docs/gpu-sharing.md, "Kubernetes"):
//   stoker.io/gpu          whole cards            "<uuid>"
//   stoker.io/gpu-memory   units of memory_unit   "<uuid>_m<k>"
//   stoker.io/gpu-compute  percent of a card      "<uuid>_c<k>"
// A node runs in one mode: whole cards, or shared (memory and compute), so
// the kubelet never gives one card away twice.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stoker/gpu_place.h"
#include "stoker/status.h"

namespace stoker::kube {

inline constexpr char kGpuResource[] = "stoker.io/gpu";
inline constexpr char kMemoryResource[] = "stoker.io/gpu-memory";
inline constexpr char kComputeResource[] = "stoker.io/gpu-compute";

enum class Resource { kWholeCards, kMemory, kCompute };
[[nodiscard]] const char* ResourceName(Resource r);
[[nodiscard]] std::optional<Resource> ResourceFromName(const std::string& name);

struct PluginSettings {
  bool whole_cards = false;                            // the node's mode
  std::uint64_t memory_unit = std::uint64_t{1} << 30;  // bytes per stoker.io/gpu-memory
  GpuPolicy policy = GpuPolicy::kBinpack;
  // Where the interposer is on the host, and where containers see it.
  std::string interposer_host_dir = "/opt/stoker/lib";
  std::string interposer_container_dir = "/usr/local/stoker";
  // The node's GPU state on the host (the plugin owns it): one folder per
  // tenant, tenants/<tenant>, that only that tenant's container mounts (its
  // memory ledger, at ledger_container_dir); the pinned limits it writes
  // for each grant, limits/<tenant>.<resource>, mounted read-only at
  // /etc/stoker/gpu-limits.d/<resource>; and the compute schedule, turns,
  // mounted at turns_container_path by containers given memory or a
  // compute share (both take turns).
  // Liveness is by file locks: PID namespaces do not matter.
  std::string ledger_host_dir = "/run/stoker";
  std::string ledger_container_dir = "/run/stoker";
  std::string turns_container_path = "/run/stoker-turns";
  // Mount <ledger_host_dir>/ld.so.preload (naming the interposer) at
  // /etc/ld.so.preload: every process of the container is held, whatever
  // its environment (a launcher that clears it, a program that resets
  // LD_PRELOAD).
  bool enforce_preload = false;
};
[[nodiscard]] Status CheckPluginSettings(const PluginSettings& settings);

// The resources a node in this mode advertises.
[[nodiscard]] std::vector<Resource> Advertised(const PluginSettings& settings);

struct AdvertisedDevice {
  std::string id;
  bool healthy = true;
  int numa_node = -1;
};
// Every device of `resource` on `cards`, in card order.
[[nodiscard]] std::vector<AdvertisedDevice> DevicesOf(Resource resource, const std::vector<GpuCard>& cards,
                                                      const PluginSettings& settings);

// A device ID's card UUID and unit; nullopt when it is not one of ours.
struct DeviceId {
  std::string uuid;
  Resource resource = Resource::kWholeCards;
  std::uint32_t unit = 0;
};
[[nodiscard]] std::optional<DeviceId> ParseDeviceId(const std::string& id);

// The devices to prefer for a container asking for `size` of `resource`
// among `available`, keeping `must_include`: all on one card when one card
// has room (chosen by the policy, or `paired_card` when it has room: the
// card the same container's other resource just went to), else the fewest
// cards. InvalidArgument for IDs that are not ours or sizes that do not fit.
[[nodiscard]] Result<std::vector<std::string>> PreferredDevices(Resource resource,
                                                                const std::vector<std::string>& available,
                                                                const std::vector<std::string>& must_include,
                                                                std::int32_t size, const std::vector<GpuCard>& cards,
                                                                const PluginSettings& settings,
                                                                const std::string& paired_card = "");

// The tenant a container given `device_ids` (of one resource) runs as: a
// digest of the IDs, unique on the node while the container holds them
// ("k8s-" and 16 hex digits).
[[nodiscard]] std::string TenantOf(std::vector<std::string> device_ids);

// What a container gets for `device_ids` of `resource`.
struct ContainerGrant {
  std::map<std::string, std::string> envs;
  struct Mount {
    std::string container_path, host_path;
    bool read_only = true;
  };
  std::vector<Mount> mounts;
  // What must exist on the host before the container starts (made by
  // PrepareHost): folders (sticky, world-writable: the container's user is
  // unknown), shared files (0666), and root's files with their text (0644).
  struct HostPath {
    // kSharedFolder: sticky, world-writable; kRootFolder: root's, 0755;
    // kAgentFile: root's, 0644, written by the plugin alone (the compute
    // schedule); kRootFile: root's, 0644, written whole with `text`.
    enum Kind { kSharedFolder, kRootFolder, kAgentFile, kRootFile } kind = kSharedFolder;
    std::string path, text;
  };
  std::vector<HostPath> host_paths;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cards;  // UUIDs, in the order the container sees them
};
[[nodiscard]] Result<ContainerGrant> GrantFor(Resource resource, const std::vector<std::string>& device_ids,
                                              const std::vector<GpuCard>& cards, const PluginSettings& settings);

// Makes a grant's host paths (root's folders for limits/ on the way).
[[nodiscard]] Status PrepareHost(const ContainerGrant& grant);

}  // namespace stoker::kube
