// stoker/byte_size.h: human byte sizes: parsing "64MiB" / "2GB" / "4096" and printing "1.5 GiB".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker {

// Accepts an integer or decimal number followed by an optional unit: B, K/KB
// (1000), KiB (1024), M/MB, MiB, G/GB, GiB, T/TB, TiB; case-insensitive.
[[nodiscard]] Result<std::uint64_t> ParseByteSize(std::string_view text);
// "812 B", "1.5 KiB", "64.0 MiB"...
[[nodiscard]] std::string FormatBytes(std::uint64_t bytes);

}  // namespace stoker
