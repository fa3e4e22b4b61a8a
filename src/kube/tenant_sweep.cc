#include "kube/tenant_sweep.h"

#include <cctype>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "share/ledger.h"

namespace stoker::kube {
namespace {

namespace fs = std::filesystem;

bool IsPluginTenant(const std::string& name) {
  if (name.size() != 20 || name.rfind("k8s-", 0) != 0) return false;
  for (std::size_t i = 4; i < name.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(name[i])) || std::isupper(static_cast<unsigned char>(name[i])))
      return false;
  return true;
}

}  // namespace

Result<TenantSweep> SweepEndedTenants(const std::string& host_dir, const std::set<std::string>& live,
                                      std::chrono::seconds grace) {
  const fs::path tenants_dir = fs::path(host_dir) / "tenants";
  const fs::path limits_dir = fs::path(host_dir) / "limits";
  std::set<std::string> known;
  for (const fs::path& dir : {tenants_dir, limits_dir}) {
    std::error_code ec;
    if (!fs::exists(dir, ec)) continue;
    fs::directory_iterator it(dir, ec);
    if (ec) return Status::IOError(fmt::format("reading {}: {}", dir.string(), ec.message()));
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (ec) return Status::IOError(fmt::format("reading {}: {}", dir.string(), ec.message()));
      std::string name = it->path().filename().string();
      if (dir == limits_dir) {
        const auto dot = name.rfind('.');
        if (dot == std::string::npos || (name.substr(dot) != ".memory" && name.substr(dot) != ".compute")) continue;
        name.resize(dot);
      }
      if (IsPluginTenant(name)) known.insert(name);
    }
  }
  TenantSweep sweep;
  const auto now = fs::file_time_type::clock::now();
  for (const std::string& tenant : known) {
    if (live.count(tenant)) continue;
    const fs::path folder = tenants_dir / tenant, ledger = folder / "ledger";
    const std::vector<fs::path> files = {folder, ledger, limits_dir / (tenant + ".memory"),
                                         limits_dir / (tenant + ".compute")};
    bool recent = false;
    for (const fs::path& f : files) {
      std::error_code ec;
      const auto changed = fs::last_write_time(f, ec);
      if (!ec && now - changed < grace) recent = true;
    }
    if (recent) continue;
    std::error_code ec;
    if (fs::exists(ledger, ec)) {
      share::LedgerReport report;
      std::string error;
      if (share::Ledger::Report(ledger.string(), &report, &error)) {
        bool held = false;
        for (const auto& t : report.tenants) held = held || !t.processes.empty();
        if (held) {
          sweep.in_use.push_back(tenant);
          continue;
        }
      } else {
        sweep.notes.push_back(fmt::format("{}: {} (removed: no container holds it)", ledger.string(), error));
      }
    }
    bool removed = true;
    fs::remove_all(folder, ec);
    if (ec) {
      sweep.notes.push_back(fmt::format("removing {}: {}", folder.string(), ec.message()));
      removed = false;
    }
    for (const char* kind : {".memory", ".compute"}) {
      const fs::path limits = limits_dir / (tenant + kind);
      if (!fs::remove(limits, ec) && ec) {
        sweep.notes.push_back(fmt::format("removing {}: {}", limits.string(), ec.message()));
        removed = false;
      }
    }
    if (removed) sweep.removed.push_back(tenant);
  }
  return sweep;
}

}  // namespace stoker::kube
