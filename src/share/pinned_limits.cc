#include "share/pinned_limits.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace stoker::share {
namespace {

bool Known(const std::string& key) {
  static const char* const kKeys[] = {"STOKER_GPU_MEMORY_LIMIT",
                                      "STOKER_GPU_COMPUTE_SHARE",
                                      "STOKER_GPU_TENANT",
                                      "STOKER_GPU_TURNS_TENANT",
                                      "STOKER_GPU_LEDGER",
                                      "STOKER_GPU_TURNS",
                                      "STOKER_GPU_DIR",
                                      "STOKER_GPU_COMPUTE_MODE",
                                      "STOKER_GPU_COMPUTE_PERIOD_MS",
                                      "STOKER_GPU_COMPUTE_STRICT",
                                      "STOKER_GPU_COMPUTE_SHARES"};
  for (const char* k : kKeys)
    if (key == k) return true;
  // Per ordinal: STOKER_GPU_MEMORY_LIMIT_<i>, STOKER_GPU_COMPUTE_SHARE_<i>.
  for (const std::string prefix : {"STOKER_GPU_MEMORY_LIMIT_", "STOKER_GPU_COMPUTE_SHARE_"})
    if (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0 &&
        key.find_first_not_of("0123456789", prefix.size()) == std::string::npos)
      return true;
  return false;
}

bool Trusted(const struct stat& st) {
  return st.st_uid == 0 && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

std::string Trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t\r") - a + 1);
}

}  // namespace

bool ReadPinnedLimits(const std::string& path, PinnedValues* values, bool* present, std::string* error) {
  values->clear();
  *present = false;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return true;
    *error = "the pinned GPU limits '" + path + "' cannot be read: " + std::strerror(errno);
    return false;
  }
  *present = true;
  struct stat st {
  }, dir{};
  const std::string folder = path.substr(0, std::max<std::size_t>(path.rfind('/'), 1));
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || !Trusted(st) || ::stat(folder.c_str(), &dir) != 0 ||
      !Trusted(dir)) {
    ::close(fd);
    *error = "the pinned GPU limits '" + path +
             "' are not to be trusted: the file and its folder must be owned by root and writable by root only";
    return false;
  }
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
    if (text.size() > (1u << 20)) break;
  }
  ::close(fd);
  std::size_t start = 0;
  for (int line = 1; start <= text.size(); ++line) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string raw = Trim(text.substr(start, end - start));
    start = end + 1;
    if (raw.empty() || raw[0] == '#') continue;
    const auto eq = raw.find('=');
    const std::string key = eq == std::string::npos ? raw : Trim(raw.substr(0, eq));
    if (eq == std::string::npos || !Known(key)) {
      *error = "the pinned GPU limits '" + path + "', line " + std::to_string(line) + ": '" + raw +
               "' is not KEY=VALUE with a STOKER_GPU_* setting";
      return false;
    }
    values->emplace_back(key, Trim(raw.substr(eq + 1)));
  }
  return true;
}

bool EffectiveShareConfig(const std::function<const char*(const char*)>& env, const std::string& pinned_path,
                          ShareConfig* config, std::string* error) {
  ShareConfig from_env;
  if (!ParseShareConfig(env, &from_env, error)) return false;
  std::vector<std::string> files = {pinned_path};
  const std::string dir_path = pinned_path + ".d";
  if (DIR* dir = ::opendir(dir_path.c_str())) {
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(dir))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(dir);
    std::sort(names.begin(), names.end());
    for (const auto& n : names) files.push_back(dir_path + "/" + n);
  }
  PinnedValues pinned;
  std::string applied;
  for (const std::string& file : files) {
    PinnedValues values;
    bool here = false;
    if (!ReadPinnedLimits(file, &values, &here, error)) return false;
    if (!here) continue;
    applied += (applied.empty() ? "" : ", ") + file;
    for (auto& v : values) pinned.push_back(std::move(v));  // a later file's value wins (found last)
  }
  const bool present = !applied.empty();
  if (!present) {
    *config = from_env;
    return true;
  }
  auto get = [&](const char* name) -> const char* {
    for (auto it = pinned.rbegin(); it != pinned.rend(); ++it)
      if (it->first == name) return it->second.c_str();
    return env(name);
  };
  std::string detail;
  if (!ParseShareConfig(get, config, &detail)) {
    *error = "the pinned GPU limits (" + applied + "): " + detail;
    return false;
  }
  // The environment may ask for less, never for more.
  std::vector<std::uint32_t> ordinals;
  for (const auto& [o, limit] : config->ordinal_limits) ordinals.push_back(o);
  for (const auto& [o, limit] : from_env.ordinal_limits) ordinals.push_back(o);
  std::vector<std::pair<std::uint32_t, std::uint64_t>> tightened;
  for (std::uint32_t o : ordinals) {
    const std::uint64_t limit = std::min(config->LimitFor(o), from_env.LimitFor(o));
    if (std::none_of(tightened.begin(), tightened.end(), [&](const auto& t) { return t.first == o; }))
      tightened.emplace_back(o, limit);
  }
  config->default_limit = std::min(config->default_limit, from_env.default_limit);
  config->ordinal_limits = std::move(tightened);
  if (config->compute_share == 0 || (from_env.compute_share != 0 && from_env.compute_share < config->compute_share))
    config->compute_share = from_env.compute_share;
  // Per-device shares are resolved when the device is known (an ordinal's
  // card is not known here): the environment's apply where lower.
  // The pinned per-device shares alone (`get` above falls back to the
  // environment's, which must not stand in for them).
  ShareConfig pinned_only;
  std::string ignored;
  auto get_pinned = [&](const char* name) -> const char* {
    for (auto it = pinned.rbegin(); it != pinned.rend(); ++it)
      if (it->first == name) return it->second.c_str();
    return nullptr;
  };
  if (ParseShareConfig(get_pinned, &pinned_only, &ignored)) {
    config->ordinal_shares = std::move(pinned_only.ordinal_shares);
    config->card_shares = std::move(pinned_only.card_shares);
  }
  config->env_compute_share = from_env.compute_share;
  config->env_ordinal_shares = std::move(from_env.ordinal_shares);
  config->env_card_shares = std::move(from_env.card_shares);
  config->pinned_from = applied;
  return true;
}

}  // namespace stoker::share
