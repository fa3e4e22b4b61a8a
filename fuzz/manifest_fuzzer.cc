// Fuzzes the CSV and JSON Lines manifest parsers.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "format/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  (void)stoker::manifest::ParseCsv(text, "fuzz.csv");
  (void)stoker::manifest::ParseJsonLines(text, "fuzz.jsonl");
  return 0;
}
