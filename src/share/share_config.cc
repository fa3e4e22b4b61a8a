#include "share/share_config.h"

#include <unistd.h>

#include <charconv>
#include <cstring>
#include <string_view>

#include "core/byte_size_parse.h"

namespace stoker::share {
namespace {

bool ParseUnsigned(std::string_view text, std::uint32_t* out) {
  if (text.empty()) return false;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

bool ParseLimit(const char* name, const char* value, std::uint64_t* out, std::string* error) {
  const auto bytes = ParseByteSizeValue(value);
  if (!bytes || *bytes == 0) {
    *error = std::string(name) + "='" + value + "' is not a memory size (for example 20GiB, 512MiB, 8000000000)";
    return false;
  }
  *out = *bytes;
  return true;
}

}  // namespace

std::uint64_t ShareConfig::LimitFor(std::uint32_t ordinal) const {
  for (const auto& [o, limit] : ordinal_limits)
    if (o == ordinal) return limit;
  return default_limit;
}

std::string UserLedgerPath(const std::string& dir, unsigned uid) {
  return dir + "/ledger-uid" + std::to_string(uid);
}

bool ValidTenantName(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return false;
  return true;
}

bool ParseShareConfig(const std::function<const char*(const char*)>& get, ShareConfig* config, std::string* error) {
  *config = ShareConfig{};
  if (const char* v = get("STOKER_GPU_TENANT"); v && *v) {
    config->tenant = v;
    if (!ValidTenantName(config->tenant)) {
      *error = std::string("STOKER_GPU_TENANT='") + v + "' must be 1-63 characters of letters, digits, '.', '_', '-'";
      return false;
    }
  } else {
    config->tenant = "uid-" + std::to_string(::getuid());
  }
  if (const char* v = get("STOKER_GPU_TURNS_TENANT"); v && *v) {
    config->turns_tenant = v;
    if (!ValidTenantName(config->turns_tenant)) {
      *error =
          std::string("STOKER_GPU_TURNS_TENANT='") + v + "' must be 1-63 characters of letters, digits, '.', '_', '-'";
      return false;
    }
  } else {
    config->turns_tenant = config->tenant + "@uid" + std::to_string(::getuid());
  }
  auto absolute = [&](const char* name, const std::string& path) {
    if (path[0] == '/') return true;
    *error = std::string(name) + "='" + path + "' must be an absolute path";
    return false;
  };
  const char* dir = get("STOKER_GPU_DIR");
  config->state_dir = dir && *dir ? dir : kDefaultStateDir;
  if (!absolute("STOKER_GPU_DIR", config->state_dir)) return false;
  const char* ledger = get("STOKER_GPU_LEDGER");
  const char* turns = get("STOKER_GPU_TURNS");
  if (ledger && *ledger) {
    config->ledger_path = ledger;
    if (!absolute("STOKER_GPU_LEDGER", config->ledger_path)) return false;
  } else {
    config->ledger_path = UserLedgerPath(config->state_dir, ::getuid());
    config->ledger_in_state_dir = true;
  }
  if (turns && *turns) {
    config->turns_path = turns;
    if (!absolute("STOKER_GPU_TURNS", config->turns_path)) return false;
  } else if (config->ledger_in_state_dir) {
    config->turns_path = config->state_dir + "/turns";
    config->turns_in_state_dir = true;
  } else {
    config->turns_path = config->ledger_path;  // one file holds both, as a single ledger did
  }
  if (const char* v = get("STOKER_GPU_MEMORY_LIMIT"); v && *v) {
    if (!ParseLimit("STOKER_GPU_MEMORY_LIMIT", v, &config->default_limit, error)) return false;
  }
  for (std::uint32_t ordinal = 0; ordinal < kMaxOrdinals; ++ordinal) {
    const std::string name = "STOKER_GPU_MEMORY_LIMIT_" + std::to_string(ordinal);
    const char* v = get(name.c_str());
    if (!v || !*v) continue;
    std::uint64_t limit = 0;
    if (!ParseLimit(name.c_str(), v, &limit, error)) return false;
    config->ordinal_limits.emplace_back(ordinal, limit);
  }
  if (const char* v = get("STOKER_GPU_COMPUTE_SHARE"); v && *v) {
    if (!ParseUnsigned(v, &config->compute_share) || config->compute_share < 1 || config->compute_share > 100) {
      *error = std::string("STOKER_GPU_COMPUTE_SHARE='") + v + "' must be a whole percentage from 1 to 100";
      return false;
    }
  }
  if (const char* v = get("STOKER_GPU_COMPUTE_MODE"); v && *v) {
    const std::string mode = v;
    if (mode != "turns" && mode != "mps") {
      *error = "STOKER_GPU_COMPUTE_MODE='" + mode + "' must be turns or mps";
      return false;
    }
    config->compute_by_mps = mode == "mps";
  }
  if (const char* v = get("STOKER_GPU_COMPUTE_STRICT"); v && *v) {
    const std::string value = v;
    if (value != "0" && value != "1") {
      *error = "STOKER_GPU_COMPUTE_STRICT='" + value + "' must be 0 or 1";
      return false;
    }
    config->compute_strict = value == "1";
  }
  if (const char* v = get("STOKER_GPU_COMPUTE_PERIOD_MS"); v && *v) {
    if (!ParseUnsigned(v, &config->compute_period_ms) || config->compute_period_ms < 10 ||
        config->compute_period_ms > 10000) {
      *error = std::string("STOKER_GPU_COMPUTE_PERIOD_MS='") + v + "' must be from 10 to 10000 milliseconds";
      return false;
    }
  }
  return true;
}

}  // namespace stoker::share
