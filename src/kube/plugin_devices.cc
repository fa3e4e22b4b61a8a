#include "kube/plugin_devices.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "core/hash.h"
#include "place/placement.h"
#include "share/ledger.h"

namespace stoker::kube {

const char* ResourceName(Resource r) {
  switch (r) {
    case Resource::kWholeCards:
      return kGpuResource;
    case Resource::kMemory:
      return kMemoryResource;
    case Resource::kCompute:
      return kComputeResource;
  }
  return "";
}

std::optional<Resource> ResourceFromName(const std::string& name) {
  for (Resource r : {Resource::kWholeCards, Resource::kMemory, Resource::kCompute})
    if (name == ResourceName(r)) return r;
  return std::nullopt;
}

Status CheckPluginSettings(const PluginSettings& s) {
  if (s.memory_unit < (std::uint64_t{1} << 20))
    return Status::InvalidArgument("the memory unit must be at least 1 MiB (one device is advertised per unit)");
  for (const std::string* dir : {&s.interposer_host_dir, &s.interposer_container_dir, &s.ledger_host_dir,
                                 &s.ledger_container_dir, &s.turns_container_path})
    if (dir->empty() || (*dir)[0] != '/')
      return Status::InvalidArgument(fmt::format("'{}' must be an absolute path", *dir));
  return Status::Ok();
}

std::vector<Resource> Advertised(const PluginSettings& settings) {
  if (settings.whole_cards) return {Resource::kWholeCards};
  return {Resource::kMemory, Resource::kCompute};
}

namespace {

std::uint32_t UnitsOf(Resource resource, const GpuCard& card, const PluginSettings& settings) {
  switch (resource) {
    case Resource::kWholeCards:
      return 1;
    case Resource::kMemory:
      return static_cast<std::uint32_t>(card.total_bytes / settings.memory_unit);
    case Resource::kCompute:
      return 100;
  }
  return 0;
}

std::string IdOf(Resource resource, const std::string& uuid, std::uint32_t unit) {
  switch (resource) {
    case Resource::kWholeCards:
      return uuid;
    case Resource::kMemory:
      return fmt::format("{}_m{}", uuid, unit);
    case Resource::kCompute:
      return fmt::format("{}_c{}", uuid, unit);
  }
  return uuid;
}

const GpuCard* CardOf(const std::vector<GpuCard>& cards, const std::string& uuid) {
  for (const GpuCard& c : cards)
    if (c.uuid == uuid) return &c;
  return nullptr;
}

}  // namespace

std::vector<AdvertisedDevice> DevicesOf(Resource resource, const std::vector<GpuCard>& cards,
                                        const PluginSettings& settings) {
  std::vector<AdvertisedDevice> out;
  for (const GpuCard& card : cards) {
    const std::uint32_t units = UnitsOf(resource, card, settings);
    for (std::uint32_t k = 0; k < units; ++k)
      out.push_back({IdOf(resource, card.uuid, k), card.healthy, card.numa_node});
  }
  return out;
}

std::optional<DeviceId> ParseDeviceId(const std::string& id) {
  if (id.rfind("GPU-", 0) != 0 && id.rfind("MIG-", 0) != 0) return std::nullopt;
  const auto sep = id.rfind('_');
  if (sep == std::string::npos) return DeviceId{id, Resource::kWholeCards, 0};
  if (sep + 2 > id.size() || (id[sep + 1] != 'm' && id[sep + 1] != 'c')) return std::nullopt;
  const std::string digits = id.substr(sep + 2);
  if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return DeviceId{id.substr(0, sep), id[sep + 1] == 'm' ? Resource::kMemory : Resource::kCompute,
                  static_cast<std::uint32_t>(std::stoul(digits))};
}

Result<std::vector<std::string>> PreferredDevices(Resource resource, const std::vector<std::string>& available,
                                                  const std::vector<std::string>& must_include, std::int32_t size,
                                                  const std::vector<GpuCard>& cards, const PluginSettings& settings,
                                                  const std::string& paired_card) {
  if (size <= 0) return Status::InvalidArgument(fmt::format("an allocation of {} devices", size));
  if (static_cast<std::size_t>(size) > available.size())
    return Status::InvalidArgument(fmt::format("{} devices asked for, {} available", size, available.size()));
  // Free units per card, lowest unit first (stable IDs are easier to read).
  std::map<std::string, std::vector<std::pair<std::uint32_t, std::string>>> free;
  for (const std::string& id : available) {
    auto parsed = ParseDeviceId(id);
    if (!parsed || parsed->resource != resource)
      return Status::InvalidArgument(fmt::format("'{}' is not a {} device", id, ResourceName(resource)));
    free[parsed->uuid].emplace_back(parsed->unit, id);
  }
  for (auto& [uuid, units] : free) std::sort(units.begin(), units.end());
  std::vector<std::string> chosen;
  std::set<std::string> taken;
  for (const std::string& id : must_include) {
    if (std::find(available.begin(), available.end(), id) == available.end())
      return Status::InvalidArgument(fmt::format("'{}' must be included but is not available", id));
    chosen.push_back(id);
    taken.insert(id);
  }
  auto take_from = [&](const std::string& uuid) {
    for (const auto& [unit, id] : free[uuid]) {
      if (chosen.size() >= static_cast<std::size_t>(size)) break;
      if (taken.insert(id).second) chosen.push_back(id);
    }
  };
  const std::size_t need = static_cast<std::size_t>(size) - chosen.size();
  auto room = [&](const std::string& uuid) {
    std::size_t n = 0;
    for (const auto& [unit, id] : free[uuid]) n += taken.count(id) ? 0 : 1;
    return n;
  };
  // The cards with room as placement sees them, in units (memory and
  // compute are counted as the "bytes" of a card), with their NUMA nodes
  // and PCIe distances, so that the choice is the CLI's.
  std::vector<place::CardState> states;
  for (const auto& [uuid, units] : free) {
    const GpuCard* info = CardOf(cards, uuid);
    place::CardState s;
    s.uuid = uuid;
    s.index = info ? info->index : 0;
    s.numa_node = info ? info->numa_node : -1;
    const std::uint64_t total = info ? UnitsOf(resource, *info, settings) : units.size();
    const std::uint64_t left = room(uuid);
    s.total_bytes = total;
    s.leased_bytes = total - std::min<std::uint64_t>(total, left);
    if (resource == Resource::kWholeCards && left == 0) s.leases = 1;  // must be included: already taken
    states.push_back(s);
  }
  for (auto& s : states) {
    const GpuCard* from = CardOf(cards, s.uuid);
    if (from == nullptr || from->link_levels.empty()) continue;
    for (const auto& other : states) {
      const GpuCard* to = CardOf(cards, other.uuid);
      const auto at = static_cast<std::size_t>(to - cards.data());
      s.link_levels.push_back(to != nullptr && at < from->link_levels.size() ? from->link_levels[at] : 0);
    }
  }
  GpuRequest request;
  request.policy = settings.policy;
  if (resource == Resource::kWholeCards) {
    request.whole_cards = true;
    request.count = static_cast<std::uint32_t>(need);
  } else {
    request.memory_bytes = need;
  }
  // One card for shares: the pairing first, then the policy's choice.
  if (resource != Resource::kWholeCards && !paired_card.empty() && free.count(paired_card) &&
      room(paired_card) >= need) {
    take_from(paired_card);
    return chosen;
  }
  if (need > 0) {
    auto pick = place::ChooseCards(request, states);
    if (pick.ok()) {
      for (std::size_t i : *pick) take_from(states[i].uuid);
      return chosen;
    }
  }
  // No single card has room for a share: the fewest cards, the fullest first
  // for binpack, the emptiest for spread.
  std::vector<std::string> order;
  for (const auto& [uuid, units] : free) order.push_back(uuid);
  std::stable_sort(order.begin(), order.end(), [&](const std::string& a, const std::string& b) {
    if (room(a) != room(b)) return settings.policy == GpuPolicy::kBinpack ? room(a) < room(b) : room(a) > room(b);
    const GpuCard* ca = CardOf(cards, a);
    const GpuCard* cb = CardOf(cards, b);
    return (ca ? ca->index : 0) < (cb ? cb->index : 0);
  });
  for (const std::string& uuid : order) take_from(uuid);
  return chosen;
}

std::string TenantOf(std::vector<std::string> device_ids) {
  // The devices given are this container's alone while it lives: their
  // digest names its tenant, unique on the node.
  std::sort(device_ids.begin(), device_ids.end());
  std::string joined;
  for (const auto& id : device_ids) joined += id + "\n";
  return fmt::format("k8s-{:016x}", Xxh3(std::as_bytes(std::span(joined.data(), joined.size()))));
}

Result<ContainerGrant> GrantFor(Resource resource, const std::vector<std::string>& device_ids,
                                const std::vector<GpuCard>& cards, const PluginSettings& settings) {
  if (device_ids.empty()) return Status::InvalidArgument("an allocation without devices");
  std::map<std::string, std::uint32_t> units_by_card;
  for (const std::string& id : device_ids) {
    auto parsed = ParseDeviceId(id);
    if (!parsed || parsed->resource != resource)
      return Status::InvalidArgument(fmt::format("'{}' is not a {} device", id, ResourceName(resource)));
    if (!CardOf(cards, parsed->uuid))
      return Status::NotFound(
          fmt::format("device '{}' names card {}, which this node no longer has", id, parsed->uuid));
    ++units_by_card[parsed->uuid];
  }
  ContainerGrant grant;
  for (const GpuCard& c : cards)
    if (units_by_card.count(c.uuid)) grant.cards.push_back(c.uuid);
  const std::string visible = fmt::format("{}", fmt::join(grant.cards, ","));
  const std::string interposer = settings.interposer_container_dir + "/libstoker-share.so";
  grant.envs["LD_PRELOAD"] = interposer;
  grant.mounts.push_back({settings.interposer_container_dir, settings.interposer_host_dir, true});
  if (settings.enforce_preload) {
    const std::string preload = settings.ledger_host_dir + "/ld.so.preload";
    grant.host_paths.push_back({ContainerGrant::HostPath::kRootFile, preload, interposer + "\n"});
    grant.mounts.push_back({"/etc/ld.so.preload", preload, true});
  }
  const std::string tenant = TenantOf(device_ids);
  // What the container may not change, whatever its environment says.
  std::string pinned;
  auto pin = [&](const std::string& key, const std::string& value) {
    grant.envs[key] = value;
    pinned += key + "=" + value + "\n";
  };
  // The node's schedule, kept by this plugin's turns broker: read-only in
  // the container, turns asked for over the broker's socket. A container
  // with a memory grant only takes turns too, for the time compute grants
  // on its card leave, while they want the card (before, it launched over
  // their turns). The kubelet merges these mounts, identical in every
  // grant, when a container has both kinds.
  auto schedule = [&] {
    const std::string turns = settings.ledger_host_dir + "/turns";
    const std::string broker = settings.ledger_host_dir + "/broker";
    grant.host_paths.push_back({ContainerGrant::HostPath::kAgentFile, turns, ""});
    grant.host_paths.push_back({ContainerGrant::HostPath::kRootFolder, broker, ""});
    grant.mounts.push_back({settings.turns_container_path, turns, true});
    grant.mounts.push_back({settings.turns_container_path + ".d", broker, true});
    pin("STOKER_GPU_TURNS", settings.turns_container_path);
    pin("STOKER_GPU_TURNS_SOCKET", settings.turns_container_path + ".d/turns.sock");
  };
  switch (resource) {
    case Resource::kWholeCards:
    case Resource::kMemory: {
      grant.envs["CUDA_VISIBLE_DEVICES"] = visible;
      grant.envs["NVIDIA_VISIBLE_DEVICES"] = visible;
      pin("STOKER_GPU_TENANT", tenant);
      // The tenant's own folder: no other container sees its ledger.
      const std::string folder = settings.ledger_host_dir + "/tenants/" + tenant;
      grant.host_paths.push_back({ContainerGrant::HostPath::kSharedFolder, folder, ""});
      grant.mounts.push_back({settings.ledger_container_dir, folder, false});
      pin("STOKER_GPU_LEDGER", settings.ledger_container_dir + "/ledger");
      if (resource == Resource::kMemory) {
        schedule();
        if (grant.cards.size() == 1) {
          pin("STOKER_GPU_MEMORY_LIMIT", std::to_string(units_by_card.begin()->second * settings.memory_unit));
        } else {
          for (std::size_t i = 0; i < grant.cards.size(); ++i)
            pin(fmt::format("STOKER_GPU_MEMORY_LIMIT_{}", i),
                std::to_string(units_by_card[grant.cards[i]] * settings.memory_unit));
        }
      }
      break;
    }
    case Resource::kCompute: {
      // Each card its own part (the plugin pairs them with the cards the
      // container's memory went to); a card the container reaches outside
      // this grant is held to the smallest part, never more.
      std::uint32_t least = 100;
      std::vector<std::string> parts;
      for (const std::string& uuid : grant.cards) {
        const std::uint32_t share = std::min<std::uint32_t>(units_by_card[uuid], 100);
        least = std::min(least, share);
        parts.push_back(fmt::format("{}:{}", uuid, share));
      }
      pin("STOKER_GPU_COMPUTE_SHARE", std::to_string(least));
      pin("STOKER_GPU_COMPUTE_SHARES", fmt::format("{}", fmt::join(parts, ",")));
      // Its tenant in the schedule is this grant's own, which only this
      // container can claim (it passes its pinned limits file, below, to
      // the broker).
      schedule();
      pin("STOKER_GPU_TURNS_TENANT", tenant);
      break;
    }
  }
  const std::string kind = resource == Resource::kCompute ? "compute" : "memory";
  const std::string limits = fmt::format("{}/limits/{}.{}", settings.ledger_host_dir, tenant, kind);
  grant.host_paths.push_back({ContainerGrant::HostPath::kRootFile, limits, pinned});
  grant.mounts.push_back({"/etc/stoker/gpu-limits.d/" + kind, limits, true});
  grant.annotations[fmt::format("{}-cards", ResourceName(resource))] = visible;
  return grant;
}

Status PrepareHost(const ContainerGrant& grant) {
  namespace fs = std::filesystem;
  for (const auto& p : grant.host_paths) {
    const fs::path path(p.path);
    std::error_code ec;
    // Parents are root's (0755): limits/ must be writable by root only.
    fs::create_directories(path.parent_path(), ec);
    if (ec) return Status::IOError(fmt::format("making {}: {}", path.parent_path().string(), ec.message()));
    switch (p.kind) {
      case ContainerGrant::HostPath::kSharedFolder:
        fs::create_directory(path, ec);
        if (!ec && ::chmod(p.path.c_str(), 01777) != 0) ec = std::error_code(errno, std::generic_category());
        break;
      case ContainerGrant::HostPath::kRootFolder:
        fs::create_directory(path, ec);
        if (!ec && ::chmod(p.path.c_str(), 0755) != 0) ec = std::error_code(errno, std::generic_category());
        break;
      case ContainerGrant::HostPath::kAgentFile: {
        // The turns broker made it when the plugin started; made again here
        // if it went missing (a ledger is made whole, then renamed in).
        share::LedgerFile kept;
        kept.mode = 0644;
        std::string error;
        std::unique_ptr<share::Ledger> made(share::Ledger::Open(p.path, &error, kept));
        if (made == nullptr) return Status::IOError(fmt::format("preparing {}: {}", p.path, error));
        if (::chown(p.path.c_str(), 0, 0) != 0 || ::chmod(p.path.c_str(), 0644) != 0)
          ec = std::error_code(errno, std::generic_category());
        break;
      }
      case ContainerGrant::HostPath::kRootFile: {
        // Written whole under a temporary name and renamed: a container
        // never reads half of it.
        const std::string temp = p.path + ".tmp";
        const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd < 0 || ::fchmod(fd, 0644) != 0 ||
            ::write(fd, p.text.data(), p.text.size()) != static_cast<ssize_t>(p.text.size()) ||
            ::rename(temp.c_str(), p.path.c_str()) != 0)
          ec = std::error_code(errno, std::generic_category());
        if (fd >= 0) ::close(fd);
        break;
      }
    }
    if (ec) return Status::IOError(fmt::format("preparing {}: {}", p.path, ec.message()));
  }
  return Status::Ok();
}

}  // namespace stoker::kube
