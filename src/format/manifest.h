// Manifests listing the files to pack: CSV (with a header row) or JSON Lines.
// Pure parsing over text; paths are returned as written.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::manifest {

// What a value of a non-file column is: JSON Lines says it; a CSV cell is
// an integer or a number when it reads as one, else a string.
enum class ValueType : std::uint8_t { kString, kInteger, kNumber, kJson };

struct Value {
  std::string column;
  std::string text;  // strings as they are; other JSON values as JSON text
  ValueType type = ValueType::kString;
  friend bool operator==(const Value&, const Value&) = default;
};

struct File {
  std::string column;  // "path", or a column named as a file column
  std::string path;    // as written
};

struct Row {
  std::size_t line = 0;      // 1-based line where the row starts, for messages
  std::vector<File> files;   // `path` first, then the file columns in the order given; empty cells left out
  std::string label;         // empty when absent
  std::string key;           // empty when absent
  std::vector<Value> extra;  // the other columns, by name; empty cells and nulls left out
};

// Parses RFC 4180 CSV: a header row naming the columns (`path`, required
// unless `file_columns` names others; `label` and `key` optional; any other
// column becomes an extra field), quoted fields with "" escapes, LF or CRLF
// line ends. `file_columns` are further columns holding file paths (an
// empty cell: the row has no such file). Every row names at least one file.
// `where` names the file in errors.
[[nodiscard]] Result<std::vector<Row>> ParseCsv(std::string_view text, std::string_view where,
                                                std::span<const std::string> file_columns = {});

// Parses JSON Lines: one object per non-blank line with a string `path`, an
// optional `label` (integer or string) and `key`, strings (or null) in the
// `file_columns`, and other members as extra fields (null ones left out).
[[nodiscard]] Result<std::vector<Row>> ParseJsonLines(std::string_view text, std::string_view where,
                                                      std::span<const std::string> file_columns = {});

}  // namespace stoker::manifest
