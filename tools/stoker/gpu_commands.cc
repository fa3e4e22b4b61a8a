// `stoker gpu run|ls`: run a command held to a GPU memory quota and compute
// share by the interposer, and show what the node's ledger holds.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/byte_size.h"
#include "stoker/gpu_place.h"
#include "stoker/gpu_share.h"
#include "stoker/text.h"

namespace stoker_cli {
namespace {

stoker::Result<stoker::GpuShareSettings> SettingsFrom(const GpuRunArgs& args) {
  stoker::GpuShareSettings s;
  if (!args.memory.empty()) {
    auto bytes = stoker::ParseByteSize(args.memory);
    if (!bytes.ok()) return bytes.error().WithContext("--memory");
    if (*bytes == 0) return stoker::Status::InvalidArgument("--memory must be above zero");
    s.memory_limit = *bytes;
  }
  for (const std::string& item : args.device_memory) {
    const auto eq = item.find('=');
    unsigned ordinal = 0;
    if (eq == std::string::npos || eq == 0 || std::sscanf(item.substr(0, eq).c_str(), "%u", &ordinal) != 1 ||
        item.substr(0, eq).find_first_not_of("0123456789") != std::string::npos)
      return stoker::Status::InvalidArgument(
          fmt::format("--device-memory '{}' must be ORDINAL=SIZE, for example 1=8GiB", item));
    auto bytes = stoker::ParseByteSize(item.substr(eq + 1));
    if (!bytes.ok()) return bytes.error().WithContext(fmt::format("--device-memory {}", item));
    s.device_memory[ordinal] = *bytes;
  }
  if (args.compute) s.compute_share = *args.compute;
  s.tenant = args.tenant;
  s.ledger = args.ledger;
  return s;
}

// "90", "90s", "10m", "2h"; "" is no limit.
stoker::Result<double> ParseWait(const std::string& text) {
  if (text.empty()) return std::numeric_limits<double>::infinity();
  double scale = 1;
  std::string number = text;
  switch (text.back()) {
    case 's':
      number.pop_back();
      break;
    case 'm':
      scale = 60, number.pop_back();
      break;
    case 'h':
      scale = 3600, number.pop_back();
      break;
    default:
      break;
  }
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(value) || value < 0)
    return stoker::Status::InvalidArgument(
        fmt::format("--wait '{}' is not a duration: give seconds (90, 90s), minutes (10m) or hours (2h)", text));
  return value * scale;
}

// The cards the caller's own CUDA_VISIBLE_DEVICES allows (UUIDs, or
// indices in NVML's PCI order); empty: all.
stoker::Result<std::vector<std::string>> AllowedCards(const stoker::GpuInventory& inventory) {
  std::vector<std::string> allowed;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  if (visible == nullptr) return allowed;
  std::string list = visible;
  std::size_t start = 0;
  while (start < list.size()) {
    std::size_t comma = list.find(',', start);
    if (comma == std::string::npos) comma = list.size();
    const std::string item = list.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    bool found = false;
    for (const auto& card : inventory.cards)
      if (card.uuid == item ||
          (item.find_first_not_of("0123456789") == std::string::npos && std::to_string(card.index) == item)) {
        allowed.push_back(card.uuid);
        found = true;
      }
    if (!found)
      return stoker::Status::InvalidArgument(
          fmt::format("CUDA_VISIBLE_DEVICES names '{}', which is not a card of this node", stoker::Printable(item)));
  }
  if (allowed.empty()) return stoker::Status::InvalidArgument("CUDA_VISIBLE_DEVICES is set but names no card");
  return allowed;
}

}  // namespace

int RunGpuRun(const GpuRunArgs& args) {
  auto settings = SettingsFrom(args);
  if (!settings.ok()) return Fail(settings.error());
  auto policy = stoker::ParseGpuPolicy(args.policy);
  if (!policy.ok()) return Fail(policy.error().WithContext("--policy"));
  std::optional<double> wait;
  if (args.wait) {
    auto seconds = ParseWait(*args.wait);
    if (!seconds.ok()) return Fail(seconds.error());
    wait = *seconds;
  }
  if (args.gpus && *args.gpus == 0) return Fail(stoker::Status::InvalidArgument("--gpus must be at least 1"));
  const bool asks = settings->memory_limit || settings->compute_share || args.gpus;
  const bool place = !args.no_place && settings->device_memory.empty() && asks;
  if (!place && (args.gpus || args.wait))
    return Fail(
        stoker::Status::InvalidArgument("--gpus and --wait choose cards: not with --no-place or --device-memory"));
  if (!settings->device_memory.empty()) {
    // A quota on a card the command will not see guards nothing. Without
    // NVML here, the interposer refuses it at cuInit instead.
    if (auto inventory = stoker::ReadGpuInventory(); inventory.ok()) {
      auto allowed = AllowedCards(*inventory);
      if (!allowed.ok()) return Fail(allowed.error());
      const std::size_t visible = allowed->empty() ? inventory->cards.size() : allowed->size();
      for (const auto& [ordinal, bytes] : settings->device_memory)
        if (ordinal >= visible)
          return Fail(stoker::Status::InvalidArgument(fmt::format(
              "--device-memory {}={}: the command sees {} GPU(s) (ordinals 0-{}{}), so GPU {} does not exist", ordinal,
              stoker::FormatBytes(bytes), visible, visible == 0 ? 0 : visible - 1,
              allowed->empty() ? "" : ", after CUDA_VISIBLE_DEVICES", ordinal)));
    }
  }
  auto interposer = stoker::FindGpuInterposer();
  if (!interposer.ok()) return Fail(interposer.error());
  auto program = stoker::CheckPreloadable(args.command.front());
  if (!program.ok()) return Fail(program.error());

  std::optional<stoker::GpuLease> lease;
  if (place) {
    stoker::GpuRequest request;
    request.count = args.gpus.value_or(1);
    request.policy = *policy;
    request.whole_cards = !settings->memory_limit && !settings->compute_share;
    if (!request.whole_cards) {
      request.memory_bytes = settings->memory_limit.value_or(0);
      request.compute_percent = settings->compute_share.value_or(0);
    }
    auto inventory = stoker::ReadGpuInventory();
    if (!inventory.ok())
      return Fail(inventory.error().WithContext("choosing a card (--no-place runs on the GPUs the command sees)"));
    auto allowed = AllowedCards(*inventory);
    if (!allowed.ok()) return Fail(allowed.error());
    request.allowed_uuids = *allowed;
    stoker::GpuPlacementOptions options;
    options.leases = args.leases;
    options.ledger = args.ledger.empty() ? stoker::DefaultGpuLedgerPath() : args.ledger;
    options.tenant = args.tenant;
    options.wait_seconds = wait;
    for (const auto& a : args.command) options.command += (options.command.empty() ? "" : " ") + a;
    if (options.command.size() > 200) options.command = options.command.substr(0, 197) + "...";
    auto placed = stoker::PlaceGpuRequest(request, *inventory, options);
    if (!placed.ok()) return Fail(placed.error());
    lease = std::move(*placed);
    settings->tenant = lease->tenant;
    std::vector<std::string> uuids;
    for (const auto& c : lease->cards) uuids.push_back(c.uuid);
    ::setenv("CUDA_VISIBLE_DEVICES", fmt::format("{}", fmt::join(uuids, ",")).c_str(), 1);
    ::setenv("STOKER_GPU_LEASE", lease->id.c_str(), 1);
  }
  auto env = stoker::GpuShareEnvironment(*settings, *interposer, std::getenv("LD_PRELOAD"));
  if (!env.ok()) return Fail(env.error());
  std::string tenant;
  for (const auto& [name, value] : *env) {
    ::setenv(name.c_str(), value.c_str(), 1);
    if (name == "STOKER_GPU_TENANT") tenant = value;
  }
  if (stoker::PinnedGpuLimitsPresent())
    Warn(
        fmt::format("{} pins this node's GPU limits: they apply on top of these (the command gets no more than they "
                    "allow)",
                    stoker::PinnedGpuLimitsPath()));
  if (!asks && settings->device_memory.empty())
    Warn("no --memory, --gpus, --device-memory or --compute: the command is only counted, not limited");
  if (!args.quiet) {
    std::vector<std::string> limits;
    if (lease && lease->whole_cards) limits.push_back("whole card" + std::string(lease->cards.size() > 1 ? "s" : ""));
    if (settings->memory_limit) limits.push_back(stoker::FormatBytes(*settings->memory_limit) + " per GPU");
    for (const auto& [ordinal, bytes] : settings->device_memory)
      limits.push_back(fmt::format("{} on GPU {}", stoker::FormatBytes(bytes), ordinal));
    if (settings->compute_share)
      limits.push_back(fmt::format("{}% of each GPU{}", *settings->compute_share,
                                   stoker::MpsRunning() ? "'s SMs (by MPS)" : "'s time"));
    std::string where;
    if (lease) {
      std::vector<std::string> uuids;
      for (const auto& c : lease->cards) uuids.push_back(c.uuid);
      where = fmt::format(" on {}", fmt::join(uuids, ", "));
    }
    fmt::print(stderr, "stoker gpu run: tenant {}{}{}{}\n", tenant, where, limits.empty() ? "" : ": ",
               fmt::join(limits, ", "));
  }
  std::vector<char*> argv;
  for (const auto& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(program->c_str(), argv.data());
  const int error = errno;
  if (lease) (void)stoker::ReleaseGpuLease(lease->id, args.leases);
  return Fail(stoker::Status::FromErrno(error, fmt::format("running {}", *program)));
}

int RunGpuList(const std::string& ledger, const std::string& leases_path, bool json) {
  auto view = stoker::ReadGpuLedger(ledger);
  if (!view.ok()) return Fail(view.error());
  auto leases = stoker::ReadGpuLeases(leases_path);
  if (!leases.ok()) return Fail(leases.error());
  auto inventory = stoker::ReadGpuInventory();
  std::vector<stoker::GpuCardUse> cards;
  if (inventory.ok()) cards = stoker::DescribeGpuUse(*inventory, *leases);
  if (json) {
    nlohmann::json j = {{"ledger", view->path}, {"repairs", view->repairs}, {"fences", view->fences}};
    j["leases_file"] = leases_path.empty() ? stoker::DefaultGpuLeasePath() : leases_path;
    if (inventory.ok()) {
      j["inventory"] = inventory->source;
    } else {
      j["inventory_error"] = inventory.error().message();
    }
    j["cards"] = nlohmann::json::array();
    for (const auto& u : cards) {
      nlohmann::json processes = nlohmann::json::array();
      for (const auto& p : u.card.processes) {
        const auto held = stoker::UnderGpuInterposer(p.pid);
        processes.push_back({{"pid", p.pid},
                             {"used_bytes", p.used_bytes},
                             {"under_interposer", held ? nlohmann::json(*held) : nlohmann::json(nullptr)}});
      }
      j["cards"].push_back(
          {{"index", u.card.index},
           {"uuid", u.card.uuid},
           {"name", u.card.name},
           {"pci_bus_id", u.card.pci_bus_id},
           {"numa_node", u.card.numa_node},
           {"link_levels", u.card.link_levels},
           {"healthy", u.card.healthy},
           {"total_bytes", u.card.total_bytes},
           {"used_bytes", u.card.used_known ? nlohmann::json(u.card.used_bytes) : nlohmann::json(nullptr)},
           {"leased_bytes", u.leased_bytes},
           {"other_bytes", u.other_bytes},
           {"free_bytes", u.free_bytes},
           {"leased_compute", u.leased_compute},
           {"leases", u.leases},
           {"whole_leased", u.whole_leased},
           {"processes", u.card.processes_known ? std::move(processes) : nlohmann::json(nullptr)}});
    }
    j["leases"] = nlohmann::json::array();
    for (const auto& l : *leases) {
      nlohmann::json lease_cards = nlohmann::json::array();
      for (const auto& c : l.cards)
        lease_cards.push_back(
            {{"uuid", c.uuid}, {"memory_bytes", c.memory_bytes}, {"compute_percent", c.compute_percent}});
      j["leases"].push_back({{"id", l.id},
                             {"tenant", l.tenant},
                             {"pid", l.pid},
                             {"whole_cards", l.whole_cards},
                             {"created_unix", l.created_unix},
                             {"command", l.command},
                             {"cards", std::move(lease_cards)}});
    }
    j["devices"] = nlohmann::json::array();
    for (const auto& d : view->devices)
      j["devices"].push_back({{"uuid", d.uuid},
                              {"physical_bytes", d.physical_bytes},
                              {"stuck_takeovers", d.stuck_takeovers},
                              {"turns_granted", d.turns_granted}});
    j["tenants"] = nlohmann::json::array();
    for (const auto& t : view->tenants) {
      nlohmann::json tenant = {{"name", t.name}, {"uid", t.owner_uid}, {"compute_share", t.compute_share}};
      tenant["devices"] = nlohmann::json::array();
      for (std::size_t d = 0; d < view->devices.size(); ++d)
        tenant["devices"].push_back({{"uuid", view->devices[d].uuid},
                                     {"quota", t.quota[d] ? nlohmann::json(*t.quota[d]) : nlohmann::json(nullptr)},
                                     {"charged", t.charged[d]},
                                     {"compute_share", t.compute_shares[d]}});
      tenant["processes"] = nlohmann::json::array();
      for (const auto& p : t.processes)
        tenant["processes"].push_back({{"pid", p.pid},
                                       {"charged", p.charged},
                                       {"oom_refusals", p.oom_refusals},
                                       {"throttled_seconds", static_cast<double>(p.throttled_ns) / 1e9},
                                       {"launches", p.launches},
                                       {"started_unix", p.started_unix}});
      j["tenants"].push_back(std::move(tenant));
    }
    j["unreadable"] = view->unreadable;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  if (inventory.ok()) {
    fmt::print("cards ({})\n  {:>3} {:<40} {:>12} {:>12} {:>12} {:>8} {:>5} {:>6}\n", inventory->source, "#", "uuid",
               "memory", "leased", "free", "compute", "numa", "leases");
    for (const auto& u : cards)
      fmt::print("  {:>3} {:<40} {:>12} {:>12} {:>12} {:>7}% {:>5} {:>6}{}\n", u.card.index, u.card.uuid,
                 stoker::FormatBytes(u.card.total_bytes), stoker::FormatBytes(u.leased_bytes),
                 stoker::FormatBytes(u.free_bytes), u.leased_compute,
                 u.card.numa_node < 0 ? std::string("-") : std::to_string(u.card.numa_node), u.leases,
                 !u.card.healthy ? "  UNHEALTHY" : (u.whole_leased ? "  whole" : ""));
    // Whoever reaches a card without the interposer is held to nothing.
    for (const auto& u : cards)
      for (const auto& p : u.card.processes) {
        const auto held = stoker::UnderGpuInterposer(p.pid);
        if (held && *held) continue;
        fmt::print("  pid {} uses {} on {} {}\n", p.pid, stoker::FormatBytes(p.used_bytes), u.card.uuid,
                   held ? "without the GPU interposer: unlimited"
                        : "(whether under the GPU interposer is unknown: another user's process; run as root)");
      }
  } else {
    fmt::print("cards: unknown ({})\n", inventory.error().message());
  }
  if (!leases->empty()) {
    fmt::print("leases\n  {:<28} {:>8} {:<28} {}\n", "id", "pid", "tenant", "command");
    for (const auto& l : *leases)
      fmt::print("  {:<28} {:>8} {:<28} {}\n", l.id, l.pid, stoker::Printable(l.tenant), stoker::Printable(l.command));
  }
  if (!view->unreadable.empty())
    fmt::print("{} other user(s)' ledger(s) not readable by you (root sees them): {}\n", view->unreadable.size(),
               stoker::Printable(fmt::format("{}", fmt::join(view->unreadable, ", "))));
  if (view->devices.empty() && view->tenants.empty()) {
    fmt::print("no process on this node is under the GPU interposer ({})\n", stoker::Printable(view->path));
    return 0;
  }
  for (std::size_t d = 0; d < view->devices.size(); ++d) {
    fmt::print("{}  {} physical\n", view->devices[d].uuid, stoker::FormatBytes(view->devices[d].physical_bytes));
    fmt::print("  {:<24} {:>12} {:>12} {:>8} {:>10}\n", "tenant", "quota", "used", "compute", "processes");
    for (const auto& t : view->tenants) {
      if (!t.quota[d] && t.charged[d] == 0) continue;
      fmt::print("  {:<24} {:>12} {:>12} {:>8} {:>10}\n", stoker::Printable(t.name),
                 t.quota[d] ? stoker::FormatBytes(*t.quota[d]) : "none", stoker::FormatBytes(t.charged[d]),
                 t.compute_shares[d] ? fmt::format("{}%", t.compute_shares[d]) : "-", t.processes.size());
    }
  }
  fmt::print("processes\n  {:>8} {:<24} {:>12} {:>12} {:>12} {:>12}\n", "pid", "tenant", "used", "refused", "throttled",
             "launches");
  for (const auto& t : view->tenants)
    for (const auto& p : t.processes) {
      std::uint64_t used = 0;
      for (auto c : p.charged) used += c;
      fmt::print("  {:>8} {:<24} {:>12} {:>12} {:>11.1f}s {:>12}\n", p.pid, stoker::Printable(t.name),
                 stoker::FormatBytes(used), p.oom_refusals, static_cast<double>(p.throttled_ns) / 1e9, p.launches);
    }
  if (view->repairs)
    fmt::print(
        "the ledger was repaired {} time(s) after a process died or stopped holding its lock ({} fenced out "
        "after {} ms)\n",
        view->repairs, view->fences, stoker::kGpuLedgerLockBoundMs);
  return 0;
}

}  // namespace stoker_cli
