#include "share/share_config.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
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

bool ParseShare(const std::string& name, const char* value, std::uint32_t* out, std::string* error) {
  if (!ParseUnsigned(value, out) || *out < 1 || *out > 100) {
    *error = name + "='" + value + "' must be a whole percentage from 1 to 100";
    return false;
  }
  return true;
}

bool SameCard(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// "GPU-<uuid>:30,GPU-<uuid>:50" (spaces around items allowed).
bool ParseCardShares(const char* value, std::vector<std::pair<std::string, std::uint32_t>>* out, std::string* error) {
  const std::string_view text(value);
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    std::string_view item = text.substr(at, comma - at);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    const std::size_t colon = item.rfind(':');
    std::uint32_t share = 0;
    if (colon == std::string_view::npos || colon == 0 || !ParseUnsigned(item.substr(colon + 1), &share) || share < 1 ||
        share > 100) {
      *error = std::string("STOKER_GPU_COMPUTE_SHARES='") + value + "': '" + std::string(item) +
               "' is not CARD:PERCENT (a card's UUID as `stoker gpu ls` shows it, a whole percentage from 1 to 100)";
      return false;
    }
    const std::string card(item.substr(0, colon));
    for (const auto& [c, s] : *out)
      if (SameCard(c, card)) {
        *error = std::string("STOKER_GPU_COMPUTE_SHARES='") + value + "' names card " + card + " twice";
        return false;
      }
    out->emplace_back(card, share);
    at = comma + 1;
  }
  return true;
}

// The most specific share of one layer: the ordinal's, the card's, or all.
std::uint32_t MostSpecific(const std::vector<std::pair<std::uint32_t, std::uint32_t>>& by_ordinal,
                           const std::vector<std::pair<std::string, std::uint32_t>>& by_card, std::uint32_t all,
                           std::uint32_t ordinal, const std::string& uuid) {
  for (const auto& [o, share] : by_ordinal)
    if (o == ordinal) return share;
  for (const auto& [card, share] : by_card)
    if (SameCard(card, uuid)) return share;
  return all;
}

}  // namespace

std::uint32_t ShareConfig::ShareFor(std::uint32_t ordinal, const std::string& uuid) const {
  const std::uint32_t set = MostSpecific(ordinal_shares, card_shares, compute_share, ordinal, uuid);
  const std::uint32_t env = MostSpecific(env_ordinal_shares, env_card_shares, env_compute_share, ordinal, uuid);
  if (set == 0) return env;
  return env == 0 ? set : std::min(set, env);
}

bool ShareConfig::HasComputeShare() const {
  return compute_share != 0 || !ordinal_shares.empty() || !card_shares.empty() || env_compute_share != 0 ||
         !env_ordinal_shares.empty() || !env_card_shares.empty();
}

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
    config->broker_tenant = config->turns_tenant;
  } else {
    config->turns_tenant = config->tenant + "@uid" + std::to_string(::getuid());
    config->broker_tenant = config->tenant;  // the agent adds "@uid<uid>" itself
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
  if (const char* v = get("STOKER_GPU_TURNS_SOCKET"); v && *v) {
    config->turns_socket = v;
    config->turns_socket_named = true;
    if (!absolute("STOKER_GPU_TURNS_SOCKET", config->turns_socket)) return false;
  } else if (config->turns_in_state_dir) {
    config->turns_socket = config->state_dir + "/turns.sock";
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
    if (!ParseShare("STOKER_GPU_COMPUTE_SHARE", v, &config->compute_share, error)) return false;
  }
  for (std::uint32_t ordinal = 0; ordinal < kMaxOrdinals; ++ordinal) {
    const std::string name = "STOKER_GPU_COMPUTE_SHARE_" + std::to_string(ordinal);
    const char* v = get(name.c_str());
    if (!v || !*v) continue;
    std::uint32_t share = 0;
    if (!ParseShare(name, v, &share, error)) return false;
    config->ordinal_shares.emplace_back(ordinal, share);
  }
  if (const char* v = get("STOKER_GPU_COMPUTE_SHARES"); v && *v) {
    if (!ParseCardShares(v, &config->card_shares, error)) return false;
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
