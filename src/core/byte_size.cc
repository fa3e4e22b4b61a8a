#include "stoker/byte_size.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace stoker {

Result<std::uint64_t> ParseByteSize(std::string_view text) {
  auto bad = [&] {
    return Status::InvalidArgument(fmt::format("'{}' is not a byte size (examples: 4096, 64MiB, 2GB, 1.5GiB)", text));
  };
  std::size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return bad();
  double number = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + i, number);
  if (ec != std::errc() || ptr != text.data() + i) return bad();
  std::string unit(text.substr(i));
  unit.erase(std::remove(unit.begin(), unit.end(), ' '), unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static constexpr std::array<std::pair<std::string_view, double>, 14> kUnits = {{
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
  }};
  for (const auto& [name, scale] : kUnits) {
    if (unit == name) {
      double bytes = number * scale;
      if (!(bytes < 1.8e19)) return bad();
      return static_cast<std::uint64_t>(std::llround(bytes));
    }
  }
  return bad();
}

std::string FormatBytes(std::uint64_t bytes) {
  static constexpr std::array<std::string_view, 7> kNames = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  std::size_t unit = 0;
  while (value >= 1024 && unit + 1 < kNames.size()) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.1f} {}", value, kNames[unit]);
}

}  // namespace stoker
