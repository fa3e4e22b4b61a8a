// The public face of GPU sharing (stoker/gpu_share.h).
#include <unistd.h>

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>

#include <fmt/format.h>

#include "share/ledger.h"
#include "share/ledger_host_pids.h"
#include "share/pinned_limits.h"
#include "share/share_config.h"
#include "share/turns_broker.h"
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

namespace {

share::ShareConfig ConfigFromEnvironment() {
  share::ShareConfig config;
  std::string error;
  (void)share::ParseShareConfig([](const char* name) { return std::getenv(name); }, &config, &error);
  if (config.ledger_path.empty()) config.ledger_path = share::UserLedgerPath(share::kDefaultStateDir, ::getuid());
  return config;
}

// Adds one ledger file's report to `view`, its devices matched by UUID.
void Merge(const share::LedgerReport& report, unsigned owner_uid, GpuLedgerView* view) {
  std::vector<std::size_t> index;  // the file's device -> the view's
  for (const auto& d : report.devices) {
    std::size_t at = 0;
    while (at < view->devices.size() && view->devices[at].uuid != d.uuid) ++at;
    if (at == view->devices.size()) {
      view->devices.push_back({d.uuid, d.physical_bytes, 0});
      for (auto& t : view->tenants) {
        t.quota.emplace_back(std::nullopt);
        t.charged.push_back(0);
        t.compute_shares.push_back(0);
        for (auto& p : t.processes) p.charged.push_back(0);
      }
    }
    view->devices[at].stuck_takeovers += d.stuck_takeovers;
    view->devices[at].turns_granted += d.turns_granted;
    index.push_back(at);
  }
  const std::size_t n = view->devices.size();
  for (const auto& t : report.tenants) {
    GpuLedgerView::Tenant tenant;
    tenant.name = t.name;
    tenant.owner_uid = owner_uid;
    tenant.quota.assign(n, std::nullopt);
    tenant.charged.assign(n, 0);
    for (std::size_t d = 0; d < index.size() && d < t.quota.size(); ++d) {
      if (t.quota[d] != share::kNoQuota) tenant.quota[index[d]] = t.quota[d];
      tenant.charged[index[d]] = t.charged[d];
    }
    tenant.compute_share = t.compute_share;
    tenant.compute_shares.assign(n, 0);
    for (std::size_t d = 0; d < index.size() && d < t.compute_shares.size(); ++d)
      tenant.compute_shares[index[d]] = t.compute_shares[d];
    for (const auto& p : t.processes) {
      GpuLedgerView::Process process{
          p.pid, std::vector<std::uint64_t>(n, 0), p.oom_refusals, p.throttled_ns, p.launches, p.started_unix};
      for (std::size_t d = 0; d < index.size() && d < p.charged.size(); ++d) process.charged[index[d]] = p.charged[d];
      tenant.processes.push_back(std::move(process));
    }
    view->tenants.push_back(std::move(tenant));
  }
  view->repairs += report.repairs;
  view->fences += report.fences;
}

Status ReadOne(const std::string& path, GpuLedgerView* view) {
  share::LedgerReport report;
  std::string error;
  if (!share::Ledger::Report(path, &report, &error)) return Status::IOError(error);
  struct stat st {};
  Merge(report, ::stat(path.c_str(), &st) == 0 ? st.st_uid : ::getuid(), view);
  return Status::Ok();
}

}  // namespace

const char* PinnedGpuLimitsPath() {
  return share::kPinnedLimitsPath;
}

bool PinnedGpuLimitsPresent() {
  return ::access(share::kPinnedLimitsPath, F_OK) == 0;
}

std::string GpuStateDir() {
  return ConfigFromEnvironment().state_dir;
}

std::string DefaultGpuLedgerPath() {
  return ConfigFromEnvironment().ledger_path;
}

Result<GpuLedgerView> ReadGpuLedger(const std::string& path) {
  GpuLedgerView view;
  const share::ShareConfig config = ConfigFromEnvironment();
  if (!path.empty() || !config.ledger_in_state_dir) {
    view.path = path.empty() ? config.ledger_path : path;
    if (Status s = ReadOne(view.path, &view); !s.ok()) return s;
    return view;
  }
  // Every user's ledger in the state folder that this user may read.
  view.path = config.state_dir;
  std::error_code ec;
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(config.state_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("ledger-uid", 0) == 0 && name.find(".tmp-") == std::string::npos) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    if (::access(file.c_str(), R_OK | W_OK) != 0) {
      view.unreadable.push_back(file);
      continue;
    }
    if (Status s = ReadOne(file, &view); !s.ok()) return s;
  }
  return view;
}

Result<std::vector<std::string>> PrepareGpuStateDir(const std::string& given) {
  const std::string dir = given.empty() ? GpuStateDir() : given;
  std::vector<std::string> changed;
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return Status::FromErrno(errno, fmt::format("looking at {}", dir));
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::FromErrno(errno, fmt::format("making {}", dir));
    changed.push_back(fmt::format("made {}", dir));
    if (::lstat(dir.c_str(), &st) != 0) return Status::FromErrno(errno, fmt::format("looking at {}", dir));
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode))
    return Status::FailedPrecondition(
        fmt::format("{} is a {}, not a folder: remove it (another user may have made it to take the GPU state over)",
                    dir, S_ISLNK(st.st_mode) ? "symbolic link" : "file"));
  if (st.st_uid != ::geteuid() || st.st_gid != ::getegid()) {
    if (::chown(dir.c_str(), ::geteuid(), ::getegid()) != 0)
      return Status::FromErrno(errno, fmt::format("taking {} (uid {}) over", dir, st.st_uid));
    changed.push_back(fmt::format("took {} over from uid {}", dir, st.st_uid));
  }
  if ((st.st_mode & 07777) != 01777) {
    if (::chmod(dir.c_str(), 01777) != 0) return Status::FromErrno(errno, fmt::format("chmod {}", dir));
    changed.push_back(fmt::format("{}: mode {:o} -> 1777", dir, st.st_mode & 07777));
  }
  // The compute schedule: the agent's turns broker writes it, users read
  // it (and ask the broker for turns).
  share::LedgerFile kept;
  kept.mode = 0644;
  std::string error;
  const std::string turns = dir + "/turns";
  const bool existed = ::lstat(turns.c_str(), &st) == 0;
  if (existed && (S_ISLNK(st.st_mode) || !S_ISREG(st.st_mode)))
    return Status::FailedPrecondition(fmt::format("{} is not a regular file: remove it", turns));
  std::unique_ptr<share::Ledger> ledger(share::Ledger::Open(turns, &error, kept));
  if (ledger == nullptr) return Status::FailedPrecondition(error);
  if (!existed) changed.push_back(fmt::format("made {}", turns));
  if (::lstat(turns.c_str(), &st) == 0 && (st.st_uid != ::geteuid() || (st.st_mode & 07777) != 0644)) {
    if (::chown(turns.c_str(), ::geteuid(), ::getegid()) != 0 || ::chmod(turns.c_str(), 0644) != 0)
      return Status::FromErrno(errno, fmt::format("making {} the agent's", turns));
    changed.push_back(fmt::format("{}: uid {} mode {:o} -> the agent's, 644 (users ask the agent for turns)", turns,
                                  st.st_uid, st.st_mode & 07777));
  }
  return changed;
}

namespace {

class TurnsBrokerHandle final : public GpuTurnsBroker {
 public:
  explicit TurnsBrokerHandle(std::unique_ptr<share::TurnsBroker> broker) : broker_(std::move(broker)) {}
  std::size_t clients() const override { return broker_->clients(); }

 private:
  std::unique_ptr<share::TurnsBroker> broker_;
};

}  // namespace

Result<std::unique_ptr<GpuTurnsBroker>> StartGpuTurnsBroker(const GpuTurnsBrokerOptions& options) {
  share::TurnsBroker::Options o;
  o.turns_path = options.turns_path;
  o.socket_path = options.socket_path;
  o.limits_dir = options.limits_dir;
  o.log = options.log;
  std::string error;
  auto broker = share::TurnsBroker::Start(o, &error);
  if (broker == nullptr) return Status::FailedPrecondition("the compute schedule's broker: " + error);
  return std::unique_ptr<GpuTurnsBroker>(new TurnsBrokerHandle(std::move(broker)));
}

std::size_t RecordGpuHostPids(const std::vector<int>& pids) {
  return share::RecordHostPids(pids);
}

std::optional<bool> UnderGpuInterposer(int pid) {
  const std::string fds = fmt::format("/proc/{}/fd", pid);
  std::error_code ec;
  std::filesystem::directory_iterator it(fds, ec);
  if (ec) return std::nullopt;
  for (const auto& entry : it) {
    // Only regular files of a ledger's size are opened (never a device or
    // a pipe of the process's, whose opening could have effects).
    struct stat st {};
    if (::stat(entry.path().c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<std::uint64_t>(st.st_size) != sizeof(share::LedgerLayout))
      continue;
    const int fd = ::open(entry.path().c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    char magic[sizeof(share::kLedgerMagic)] = {};
    const bool ledger = ::pread(fd, magic, sizeof(magic), 0) == static_cast<ssize_t>(sizeof(magic)) &&
                        std::memcmp(magic, share::kLedgerMagic, sizeof(magic)) == 0;
    ::close(fd);
    if (ledger) return true;
  }
  return false;
}

}  // namespace stoker
