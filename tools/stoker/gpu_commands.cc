// `stoker gpu run|ls`: run a command held to a GPU memory quota and compute
// share by the interposer, and show what the node's ledger holds.
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/byte_size.h"
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

}  // namespace

int RunGpuRun(const GpuRunArgs& args) {
  auto settings = SettingsFrom(args);
  if (!settings.ok()) return Fail(settings.error());
  auto interposer = stoker::FindGpuInterposer();
  if (!interposer.ok()) return Fail(interposer.error());
  auto program = stoker::CheckPreloadable(args.command.front());
  if (!program.ok()) return Fail(program.error());
  auto env = stoker::GpuShareEnvironment(*settings, *interposer, std::getenv("LD_PRELOAD"));
  if (!env.ok()) return Fail(env.error());
  std::string tenant;
  for (const auto& [name, value] : *env) {
    ::setenv(name.c_str(), value.c_str(), 1);
    if (name == "STOKER_GPU_TENANT") tenant = value;
  }
  if (!settings->memory_limit && settings->device_memory.empty() && !settings->compute_share)
    Warn("no --memory, --device-memory or --compute: the command is only counted, not limited");
  if (!args.quiet) {
    std::vector<std::string> limits;
    if (settings->memory_limit) limits.push_back(stoker::FormatBytes(*settings->memory_limit) + " per GPU");
    for (const auto& [ordinal, bytes] : settings->device_memory)
      limits.push_back(fmt::format("{} on GPU {}", stoker::FormatBytes(bytes), ordinal));
    if (settings->compute_share)
      limits.push_back(fmt::format("{}% of each GPU{}", *settings->compute_share,
                                   stoker::MpsRunning() ? "'s SMs (by MPS)" : "'s time"));
    fmt::print(stderr, "stoker gpu run: tenant {}{}{}\n", tenant, limits.empty() ? "" : ": ", fmt::join(limits, ", "));
  }
  std::vector<char*> argv;
  for (const auto& a : args.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  ::execv(program->c_str(), argv.data());
  return Fail(stoker::Status::FromErrno(errno, fmt::format("running {}", *program)));
}

int RunGpuList(const std::string& ledger, bool json) {
  auto view = stoker::ReadGpuLedger(ledger);
  if (!view.ok()) return Fail(view.error());
  if (json) {
    nlohmann::json j = {{"ledger", view->path}, {"repairs", view->repairs}};
    j["devices"] = nlohmann::json::array();
    for (const auto& d : view->devices)
      j["devices"].push_back({{"uuid", d.uuid}, {"physical_bytes", d.physical_bytes}});
    j["tenants"] = nlohmann::json::array();
    for (const auto& t : view->tenants) {
      nlohmann::json tenant = {{"name", t.name}, {"compute_share", t.compute_share}};
      tenant["devices"] = nlohmann::json::array();
      for (std::size_t d = 0; d < view->devices.size(); ++d)
        tenant["devices"].push_back({{"uuid", view->devices[d].uuid},
                                     {"quota", t.quota[d] ? nlohmann::json(*t.quota[d]) : nlohmann::json(nullptr)},
                                     {"charged", t.charged[d]}});
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
    fmt::print("{}\n", j.dump());
    return 0;
  }
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
                 t.compute_share ? fmt::format("{}%", t.compute_share) : "-", t.processes.size());
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
  if (view->repairs) fmt::print("the ledger was repaired {} time(s) after a process died holding it\n", view->repairs);
  return 0;
}

}  // namespace stoker_cli
