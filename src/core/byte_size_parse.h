// Parsing "64MiB" / "2GB" / "4096" without allocating or formatting: the
// one implementation, shared by ParseByteSize (stoker/byte_size.h) and the
// GPU interposer, which keeps its dependencies to the C library.
#pragma once

#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace stoker {

// An integer or decimal number followed by an optional unit: B, K/KB
// (1000), KiB (1024), M/MB, MiB, G/GB, GiB, T/TB, TiB; case-insensitive,
// spaces ignored. nullopt when malformed or beyond 2^64.
[[nodiscard]] inline std::optional<std::uint64_t> ParseByteSizeValue(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || text[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, number);
  if (ec != std::errc() || ptr != text.data() + i) return std::nullopt;
  char unit[8] = {};
  std::size_t n = 0;
  for (char c : text.substr(i)) {
    if (c == ' ') continue;
    if (n + 1 >= sizeof(unit)) return std::nullopt;
    unit[n++] = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
  }
  const std::string_view u(unit, n);
  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {
      {"", 1},
      {"b", 1},
      {"k", 1e3},
      {"kb", 1e3},
      {"kib", 1024.0},
      {"m", 1e6},
      {"mb", 1e6},
      {"mib", 1048576.0},
      {"g", 1e9},
      {"gb", 1e9},
      {"gib", 1073741824.0},
      {"t", 1e12},
      {"tb", 1e12},
      {"tib", 1099511627776.0},
  };
  for (const auto& [name, scale] : kUnits) {
    if (u != name) continue;
    const double bytes = number * scale;
    if (!(bytes < 1.8e19)) return std::nullopt;
    return static_cast<std::uint64_t>(std::llround(bytes));
  }
  return std::nullopt;
}

}  // namespace stoker
