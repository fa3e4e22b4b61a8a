// Fuzzes the CSV and JSON Lines manifest parsers, with and without file
// columns (the first byte picks them).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "format/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  static const std::vector<std::string> kNone, kMask = {"mask"}, kTwo = {"image", "mask"};
  const std::vector<std::string>& columns = data[0] % 3 == 0 ? kNone : data[0] % 3 == 1 ? kMask : kTwo;
  std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  for (auto rows : {stoker::manifest::ParseCsv(text, "fuzz.csv", columns),
                    stoker::manifest::ParseJsonLines(text, "fuzz.jsonl", columns)}) {
    if (!rows.ok()) continue;
    for (const auto& row : *rows)
      if (row.files.empty()) __builtin_trap();  // every row names a file
  }
  return 0;
}
