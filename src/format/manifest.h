// Manifests listing the files to pack: CSV (with a header row) or JSON Lines.
// Pure parsing over text; paths are returned as written.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::manifest {

struct Row {
  std::size_t line = 0;  // 1-based line where the row starts, for messages
  std::string path;
  std::string label;                                       // empty when absent
  std::string key;                                         // empty when absent
  std::vector<std::pair<std::string, std::string>> extra;  // column -> text
};

// Parses RFC 4180 CSV: a header row naming the columns (`path` required;
// `label` and `key` optional; any other column becomes an extra field),
// quoted fields with "" escapes, LF or CRLF line ends. `where` names the file
// in errors.
[[nodiscard]] Result<std::vector<Row>> ParseCsv(std::string_view text, std::string_view where);

// Parses JSON Lines: one object per non-blank line with a string `path`, an
// optional `label` (integer or string) and `key`, and other members as extra
// fields (strings as they are, other values as JSON text; null skipped).
[[nodiscard]] Result<std::vector<Row>> ParseJsonLines(std::string_view text, std::string_view where);

}  // namespace stoker::manifest
