#include "place/lease_book.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stoker/file_system.h"
#include "stoker/gpu_share.h"

namespace stoker::place {
namespace {

using nlohmann::json;

Status Bad(const std::string& path, const std::string& where, const std::string& what) {
  return Status::Corruption(fmt::format("{}: {}: {}", path, where, what));
}

}  // namespace

Result<std::vector<GpuLease>> ParseLeases(std::string_view text, const std::string& path) {
  std::vector<GpuLease> leases;
  if (text.empty()) return leases;
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Bad(path, "the file", "is not a JSON object (not a lease file?)");
  if (!j.contains("format") || !j["format"].is_string() || j["format"].get<std::string>() != kLeaseFormat)
    return Bad(path, "\"format\"", fmt::format("is not \"{}\"", kLeaseFormat));
  if (!j.contains("version") || !j["version"].is_number_integer()) return Bad(path, "\"version\"", "is missing");
  if (j["version"].get<std::int64_t>() != kLeaseVersion)
    return Status::FailedPrecondition(fmt::format(
        "{}: lease file version {} is not the version {} this stoker reads; let the commands holding its leases end, "
        "or upgrade stoker",
        path, j["version"].dump(), kLeaseVersion));
  if (!j.contains("leases") || !j["leases"].is_array()) return Bad(path, "\"leases\"", "is not a list");
  std::set<std::string> ids;
  for (std::size_t n = 0; n < j["leases"].size(); ++n) {
    const json& l = j["leases"][n];
    const std::string where = fmt::format("lease {}", n);
    if (!l.is_object()) return Bad(path, where, "is not an object");
    auto str = [&](const char* key, std::string* out) -> Status {
      if (!l.contains(key) || !l[key].is_string()) return Bad(path, where, fmt::format("\"{}\" is not a string", key));
      *out = l[key].get<std::string>();
      return Status::Ok();
    };
    auto uint = [&](const json& o, const char* key, std::uint64_t* out, const std::string& at) -> Status {
      if (!o.contains(key) || !o[key].is_number_unsigned())
        return Bad(path, at, fmt::format("\"{}\" is not a non-negative integer", key));
      *out = o[key].get<std::uint64_t>();
      return Status::Ok();
    };
    GpuLease lease;
    std::uint64_t pid = 0;
    for (Status s :
         {str("id", &lease.id), str("tenant", &lease.tenant), str("command", &lease.command),
          str("ledger", &lease.ledger), uint(l, "pid", &pid, where), uint(l, "pid_start", &lease.pid_start, where),
          uint(l, "created_unix", &lease.created_unix, where)})
      if (!s.ok()) return s;
    if (lease.id.empty() || !ids.insert(lease.id).second) return Bad(path, where, "its \"id\" is empty or repeated");
    if (pid == 0 || pid > 0x7fffffff) return Bad(path, where, "\"pid\" is not a process id");
    lease.pid = static_cast<int>(pid);
    if (!l.contains("whole_cards") || !l["whole_cards"].is_boolean())
      return Bad(path, where, "\"whole_cards\" is not true or false");
    lease.whole_cards = l["whole_cards"].get<bool>();
    if (!l.contains("cards") || !l["cards"].is_array() || l["cards"].empty())
      return Bad(path, where, "\"cards\" is not a non-empty list");
    for (std::size_t c = 0; c < l["cards"].size(); ++c) {
      const json& card = l["cards"][c];
      const std::string at = fmt::format("lease {} card {}", n, c);
      if (!card.is_object() || !card.contains("uuid") || !card["uuid"].is_string())
        return Bad(path, at, "\"uuid\" is not a string");
      GpuLeaseCard out;
      out.uuid = card["uuid"].get<std::string>();
      std::uint64_t compute = 0;
      for (Status s : {uint(card, "memory_bytes", &out.memory_bytes, at), uint(card, "compute_percent", &compute, at)})
        if (!s.ok()) return s;
      if (compute > 100) return Bad(path, at, "\"compute_percent\" is above 100");
      out.compute_percent = static_cast<std::uint32_t>(compute);
      lease.cards.push_back(std::move(out));
    }
    leases.push_back(std::move(lease));
  }
  return leases;
}

std::string SerializeLeases(const std::vector<GpuLease>& leases) {
  json j = {{"format", kLeaseFormat}, {"version", kLeaseVersion}, {"leases", json::array()}};
  for (const GpuLease& l : leases) {
    json cards = json::array();
    for (const GpuLeaseCard& c : l.cards)
      cards.push_back({{"uuid", c.uuid}, {"memory_bytes", c.memory_bytes}, {"compute_percent", c.compute_percent}});
    j["leases"].push_back({{"id", l.id},
                           {"tenant", l.tenant},
                           {"pid", l.pid},
                           {"pid_start", l.pid_start},
                           {"created_unix", l.created_unix},
                           {"whole_cards", l.whole_cards},
                           {"command", l.command},
                           {"ledger", l.ledger},
                           {"cards", std::move(cards)}});
  }
  return j.dump(1, ' ', false, json::error_handler_t::replace) + "\n";
}

std::uint64_t ProcessStartTime(int pid) {
  if (pid <= 0) return 0;
  std::ifstream in(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  // After "pid (comm)": state is field 3; starttime is field 22.
  std::size_t pos = close + 1;
  for (int field = 3; field <= 22; ++field) {
    pos = stat.find_first_not_of(' ', pos);
    if (pos == std::string::npos) return 0;
    if (field == 3 && stat[pos] == 'Z') return 0;  // a zombie has ended
    const std::size_t end = stat.find(' ', pos);
    if (field == 22) return std::strtoull(stat.substr(pos, end - pos).c_str(), nullptr, 10);
    pos = end;
  }
  return 0;
}

bool LeaseBook::PerUser(const std::string& path) {
  const std::string name = path.substr(path.rfind('/') + 1);
  return name.rfind("leases-uid", 0) == 0 && name.size() > 15 && name.ends_with(".json");
}

namespace {

// Opens (making it if missing) a lock file that others may have made: a
// flock needs no write permission, and opening another user's file with
// O_CREAT in a sticky folder is refused (fs.protected_regular).
Result<UniqueFd> OpenLockFile(const std::string& lock_path) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    UniqueFd fd(::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.valid()) return fd;
    if (errno != ENOENT) break;
    UniqueFd made(::open(lock_path.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (made.valid()) {
      (void)::fchmod(made.get(), 0644);
      return made;
    }
    if (errno != EEXIST) break;
  }
  return Status::FromErrno(errno, fmt::format("opening the lease lock {}", lock_path));
}

Status ReadInto(const std::string& path, std::vector<GpuLease>* leases) {
  auto bytes = ReadWholeFile(*FileSystem::Default(), path);
  if (!bytes.ok()) return bytes.error().code() == StatusCode::kNotFound ? Status::Ok() : bytes.error();
  auto parsed = ParseLeases(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), path);
  if (!parsed.ok()) return parsed.error();
  for (auto& l : *parsed) leases->push_back(std::move(l));
  return Status::Ok();
}

}  // namespace

Result<LeaseBook> LeaseBook::Open(const std::string& path, double wait_seconds) {
  const bool per_user = PerUser(path);
  const std::string dir = path.substr(0, path.rfind('/'));
  if (per_user && !dir.empty() && ::mkdir(dir.c_str(), 0777) == 0) (void)::chmod(dir.c_str(), 01777);
  const std::string lock_path = per_user ? dir + "/leases.lock" : path + ".lock";
  auto lock = OpenLockFile(lock_path);
  if (!lock.ok()) return lock.error();
  // Bounded: a process that holds the lock and never lets go (stopped, or
  // another user's on purpose) must not hang every placement on the node.
  const auto start = std::chrono::steady_clock::now();
  while (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return Status::FromErrno(errno, fmt::format("locking {}", lock_path));
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= wait_seconds)
      return Status::DeadlineExceeded(
          fmt::format("the lease lock {} has been held by another process for {:.0f} s (see /proc/locks for its pid)",
                      lock_path, wait_seconds));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  LeaseBook book(path, std::move(*lock));
  if (Status s = ReadInto(path, &book.leases_); !s.ok()) return s;
  if (per_user) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
      const std::string other = entry.path().string();
      if (other == path || !PerUser(other)) continue;
      std::vector<GpuLease> theirs;
      if (Status s = ReadInto(other, &theirs); !s.ok()) return s;
      for (auto& l : theirs) {
        book.foreign_.insert(l.id);
        book.leases_.push_back(std::move(l));
      }
    }
  }
  return book;
}

const LedgerViews::View& LedgerViews::Get(const std::string& ledger) {
  auto [it, fresh] = views_.try_emplace(ledger);
  if (!fresh) return it->second;
  auto view = ReadGpuLedger(ledger);  // an unreadable ledger: no live tenants, nothing charged
  if (view.ok())
    for (const auto& t : view->tenants) {
      if (!t.processes.empty()) it->second.live.insert(t.name);
      for (std::size_t d = 0; d < view->devices.size() && d < t.charged.size(); ++d)
        it->second.charged[{t.name, view->devices[d].uuid}] += t.charged[d];
    }
  return it->second;
}

bool LedgerViews::TenantLive(const std::string& ledger, const std::string& tenant) {
  return Get(ledger).live.count(tenant) > 0;
}

std::uint64_t LedgerViews::Charged(const std::string& ledger, const std::string& tenant, const std::string& uuid) {
  const View& view = Get(ledger);
  const auto it = view.charged.find({tenant, uuid});
  return it == view.charged.end() ? 0 : it->second;
}

int LeaseBook::ReclaimDead(LedgerViews& ledgers) {
  int reclaimed = 0;
  std::erase_if(leases_, [&](const GpuLease& l) {
    const bool alive =
        (l.pid_start != 0 && ProcessStartTime(l.pid) == l.pid_start) || ledgers.TenantLive(l.ledger, l.tenant);
    if (!alive) ++reclaimed;
    return !alive;
  });
  return reclaimed;
}

Status LeaseBook::Save() {
  std::vector<GpuLease> mine;
  for (const GpuLease& l : leases_)
    if (!Foreign(l.id)) mine.push_back(l);
  const std::string text = SerializeLeases(mine);
  return WriteWholeFileAtomically(*FileSystem::Default(), path_,
                                  std::span(reinterpret_cast<const std::byte*>(text.data()), text.size()));
}

}  // namespace stoker::place
