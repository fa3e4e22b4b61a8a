// The public face of GPU sharing (stoker/gpu_share.h).
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>

#include "share/ledger.h"
#include "share/share_config.h"
#include "stoker/gpu_share.h"

namespace stoker {

Result<std::vector<std::pair<std::string, std::string>>> GpuShareEnvironment(const GpuShareSettings& settings,
                                                                             const std::string& interposer,
                                                                             const char* current_preload) {
  std::vector<std::pair<std::string, std::string>> env;
  std::string preload = interposer;
  if (current_preload && *current_preload) preload += std::string(":") + current_preload;
  env.emplace_back("LD_PRELOAD", preload);
  const std::string tenant = settings.tenant.empty() ? fmt::format("run-{}", ::getpid()) : settings.tenant;
  if (!share::ValidTenantName(tenant))
    return Status::InvalidArgument(
        fmt::format("tenant '{}' must be 1-63 characters of letters, digits, '.', '_' and '-'", tenant));
  env.emplace_back("STOKER_GPU_TENANT", tenant);
  if (settings.memory_limit) {
    if (*settings.memory_limit == 0) return Status::InvalidArgument("the memory limit must be above zero");
    env.emplace_back("STOKER_GPU_MEMORY_LIMIT", std::to_string(*settings.memory_limit));
  }
  for (const auto& [ordinal, bytes] : settings.device_memory) {
    if (ordinal >= share::kMaxOrdinals)
      return Status::InvalidArgument(
          fmt::format("device {} is beyond the {} devices a process may see", ordinal, share::kMaxOrdinals));
    if (bytes == 0)
      return Status::InvalidArgument(fmt::format("the memory limit of device {} must be above zero", ordinal));
    env.emplace_back(fmt::format("STOKER_GPU_MEMORY_LIMIT_{}", ordinal), std::to_string(bytes));
  }
  if (settings.compute_share) {
    if (*settings.compute_share < 1 || *settings.compute_share > 100)
      return Status::InvalidArgument(
          fmt::format("the compute share must be a percentage from 1 to 100, not {}", *settings.compute_share));
    env.emplace_back("STOKER_GPU_COMPUTE_SHARE", std::to_string(*settings.compute_share));
    // MPS splits the SMs itself, without taking turns: where it runs, it
    // holds the command to its share.
    if (MpsRunning()) {
      env.emplace_back("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", std::to_string(*settings.compute_share));
      env.emplace_back("STOKER_GPU_COMPUTE_MODE", "mps");
    }
  }
  if (!settings.ledger.empty()) {
    if (settings.ledger[0] != '/')
      return Status::InvalidArgument(fmt::format("the ledger '{}' must be an absolute path", settings.ledger));
    env.emplace_back("STOKER_GPU_LEDGER", settings.ledger);
  }
  // What the interposer will read must parse the same way here.
  share::ShareConfig config;
  std::string error;
  auto get = [&](const char* name) -> const char* {
    for (const auto& [k, v] : env)
      if (k == name) return v.c_str();
    return nullptr;
  };
  if (!share::ParseShareConfig(get, &config, &error)) return Status::InvalidArgument(error);
  return env;
}

bool MpsRunning() {
  const char* dir = std::getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string control = std::string(dir && *dir ? dir : "/tmp/nvidia-mps") + "/control";
  std::error_code ec;
  return std::filesystem::exists(control, ec);
}

Result<std::string> FindGpuInterposer() {
  namespace fs = std::filesystem;
  constexpr char kName[] = "libstoker-share.so";
  std::vector<std::string> tried;
  if (const char* env = std::getenv("STOKER_GPU_INTERPOSER"); env && *env) {
    std::error_code ec;
    if (fs::is_regular_file(env, ec)) return fs::absolute(env).string();
    return Status::NotFound(fmt::format("STOKER_GPU_INTERPOSER names '{}', which is not a file", env));
  }
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path dir = self.parent_path();
    for (const fs::path& candidate : {dir / "lib" / kName, dir.parent_path() / "lib" / kName, dir / kName,
                                      dir.parent_path() / "lib" / "stoker" / kName}) {
      tried.push_back(candidate.string());
      if (fs::is_regular_file(candidate, ec)) return candidate.string();
    }
  }
  return Status::NotFound(fmt::format(
      "the GPU interposer {} was not found (looked at {}); build it (it needs the CUDA toolkit's headers) or set "
      "STOKER_GPU_INTERPOSER",
      kName, fmt::join(tried, ", ")));
}

static_assert(kGpuLedgerLockBoundMs * 1'000'000ull == share::kLockBoundNs);

std::string DefaultGpuLedgerPath() {
  const char* env = std::getenv("STOKER_GPU_LEDGER");
  return env && *env ? env : share::kDefaultLedgerPath;
}

Result<GpuLedgerView> ReadGpuLedger(const std::string& path) {
  GpuLedgerView view;
  view.path = path.empty() ? DefaultGpuLedgerPath() : path;
  share::LedgerReport report;
  std::string error;
  if (!share::Ledger::Report(view.path, &report, &error)) return Status::IOError(error);
  for (const auto& d : report.devices) view.devices.push_back({d.uuid, d.physical_bytes});
  for (const auto& t : report.tenants) {
    GpuLedgerView::Tenant tenant;
    tenant.name = t.name;
    for (std::uint64_t q : t.quota) tenant.quota.push_back(q == share::kNoQuota ? std::nullopt : std::optional(q));
    tenant.charged = t.charged;
    tenant.compute_share = t.compute_share;
    for (const auto& p : t.processes)
      tenant.processes.push_back({p.pid, p.charged, p.oom_refusals, p.throttled_ns, p.launches, p.started_unix});
    view.tenants.push_back(std::move(tenant));
  }
  view.repairs = report.repairs;
  view.fences = report.fences;
  return view;
}

}  // namespace stoker
