#include "stoker/byte_size.h"

#include <array>
#include <string_view>

#include <fmt/format.h>

#include "core/byte_size_parse.h"

namespace stoker {

Result<std::uint64_t> ParseByteSize(std::string_view text) {
  if (auto bytes = ParseByteSizeValue(text)) return *bytes;
  return Status::InvalidArgument(fmt::format("'{}' is not a byte size (examples: 4096, 64MiB, 2GB, 1.5GiB)", text));
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
