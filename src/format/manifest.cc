#include "format/manifest.h"

#include <algorithm>
#include <cctype>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "stoker/text.h"

namespace stoker::manifest {
namespace {

// Splits CSV text into records of fields; tracks the line each record starts on.
Result<std::vector<std::pair<std::size_t, std::vector<std::string>>>> SplitCsv(std::string_view text,
                                                                               std::string_view where) {
  std::vector<std::pair<std::size_t, std::vector<std::string>>> records;
  std::vector<std::string> fields;
  std::string field;
  std::size_t line = 1, record_line = 1;
  bool in_quotes = false, field_started = false, any = false;
  auto end_field = [&] {
    fields.push_back(std::move(field));
    field.clear();
    field_started = false;
  };
  auto end_record = [&] {
    end_field();
    bool blank = fields.size() == 1 && fields[0].empty();
    if (!blank) records.emplace_back(record_line, std::move(fields));
    fields.clear();
    any = false;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_quotes) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field += '"';
          ++i;
        } else {
          in_quotes = false;
        }
      } else {
        if (c == '\n') ++line;
        field += c;
      }
      continue;
    }
    if (!any) record_line = line;
    any = true;
    if (c == '"') {
      if (field_started || !field.empty())
        return Status::InvalidArgument(fmt::format("{}:{}: stray '\"' inside an unquoted CSV field", where, line));
      in_quotes = true;
      field_started = true;
    } else if (c == ',') {
      end_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_record();
      ++line;
    } else {
      field += c;
    }
  }
  if (in_quotes)
    return Status::InvalidArgument(fmt::format("{}:{}: unterminated quoted CSV field", where, record_line));
  if (any) end_record();
  return records;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool IsFileColumn(std::string_view name, std::span<const std::string> file_columns) {
  return name == "path" || std::find(file_columns.begin(), file_columns.end(), name) != file_columns.end();
}

// A CSV cell's type: an integer (optional '-', digits), a number (JSON's
// grammar for numbers, so no "nan", "inf" or hex), else a string.
ValueType CsvValueType(std::string_view t) {
  std::size_t i = 0;
  const std::size_t n = t.size();
  auto digits = [&] {
    const std::size_t start = i;
    while (i < n && t[i] >= '0' && t[i] <= '9') ++i;
    return i > start;
  };
  if (i < n && t[i] == '-') ++i;
  if (!digits()) return ValueType::kString;
  bool integer = true;
  if (i < n && t[i] == '.') {
    ++i;
    integer = false;
    if (!digits()) return ValueType::kString;
  }
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    integer = false;
    if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
    if (!digits()) return ValueType::kString;
  }
  if (i != n) return ValueType::kString;
  if (integer) {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + n, v);
    if (ec != std::errc() || end != t.data() + n) return ValueType::kNumber;  // too large for int64
  }
  return integer ? ValueType::kInteger : ValueType::kNumber;
}

// Puts `path` first, then the file columns in the order they were given.
void OrderFiles(std::vector<File>& files, std::span<const std::string> file_columns) {
  auto rank = [&](const File& f) -> std::size_t {
    if (f.column == "path") return 0;
    return 1 + static_cast<std::size_t>(std::find(file_columns.begin(), file_columns.end(), f.column) -
                                        file_columns.begin());
  };
  std::stable_sort(files.begin(), files.end(), [&](const File& a, const File& b) { return rank(a) < rank(b); });
}

Status CheckFileColumns(std::span<const std::string> file_columns, std::string_view where) {
  for (std::size_t i = 0; i < file_columns.size(); ++i) {
    const std::string& c = file_columns[i];
    if (c.empty() || c == "label" || c == "key" || c == "path" || c != Lower(c) ||
        c.find_first_of("./ \t") != std::string::npos)
      return Status::InvalidArgument(fmt::format(
          "{}: '{}' cannot be a file column (a lower-case column name without '.', '/' or spaces, other than path, "
          "label and key)",
          where, c));
    if (std::find(file_columns.begin(), file_columns.begin() + static_cast<std::ptrdiff_t>(i), c) !=
        file_columns.begin() + static_cast<std::ptrdiff_t>(i))
      return Status::InvalidArgument(fmt::format("{}: file column '{}' is named twice", where, c));
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<Row>> ParseCsv(std::string_view text, std::string_view where,
                                  std::span<const std::string> file_columns) {
  STOKER_RETURN_IF_ERROR(CheckFileColumns(file_columns, where));
  STOKER_ASSIGN_OR_RETURN(auto records, SplitCsv(text, where));
  if (records.empty()) return Status::InvalidArgument(fmt::format("{}: empty manifest (expected a header row)", where));
  const auto& header = records[0].second;
  int label_col = -1, key_col = -1;
  bool has_path = false;
  std::vector<std::string> names;
  for (std::size_t c = 0; c < header.size(); ++c) {
    std::string name = Lower(header[c]);
    if (std::find(names.begin(), names.end(), name) != names.end())
      return Status::InvalidArgument(fmt::format("{}:1: column '{}' appears twice in the header", where, header[c]));
    if (name == "path") has_path = true;
    if (name == "label") label_col = static_cast<int>(c);
    if (name == "key") key_col = static_cast<int>(c);
    names.push_back(std::move(name));
  }
  if (!has_path && file_columns.empty())
    return Status::InvalidArgument(
        fmt::format("{}:1: header has no 'path' column (columns: {})", where, fmt::join(header, ", ")));
  for (const auto& c : file_columns)
    if (std::find(names.begin(), names.end(), c) == names.end())
      return Status::InvalidArgument(
          fmt::format("{}:1: file column '{}' is not in the header (columns: {})", where, c, fmt::join(header, ", ")));
  std::vector<Row> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    auto& [line, fields] = records[r];
    if (fields.size() != header.size()) {
      return Status::InvalidArgument(fmt::format("{}:{}: row has {}, the header has {}", where, line,
                                                 Counted(fields.size(), "column", "columns"), header.size()));
    }
    Row row;
    row.line = line;
    for (std::size_t c = 0; c < fields.size(); ++c) {
      if (IsFileColumn(names[c], file_columns)) {
        if (!fields[c].empty()) row.files.push_back({names[c], std::move(fields[c])});
      } else if (static_cast<int>(c) == label_col) {
        row.label = std::move(fields[c]);
      } else if (static_cast<int>(c) == key_col) {
        row.key = std::move(fields[c]);
      } else if (!fields[c].empty()) {
        const ValueType type = CsvValueType(fields[c]);
        row.extra.push_back({names[c], std::move(fields[c]), type});
      }
    }
    if (row.files.empty())
      return Status::InvalidArgument(fmt::format("{}:{}: no file: {} empty", where, line,
                                                 file_columns.empty() ? "path is" : "every file column is"));
    OrderFiles(row.files, file_columns);
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<std::vector<Row>> ParseJsonLines(std::string_view text, std::string_view where,
                                        std::span<const std::string> file_columns) {
  STOKER_RETURN_IF_ERROR(CheckFileColumns(file_columns, where));
  std::vector<Row> rows;
  std::size_t line = 0;
  while (!text.empty()) {
    ++line;
    std::size_t nl = text.find('\n');
    std::string_view raw = text.substr(0, nl);
    text = nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1);
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    auto json = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (json.is_discarded()) return Status::InvalidArgument(fmt::format("{}:{}: not valid JSON", where, line));
    if (!json.is_object()) return Status::InvalidArgument(fmt::format("{}:{}: expected a JSON object", where, line));
    Row row;
    row.line = line;
    for (auto it = json.begin(); it != json.end(); ++it) {
      const std::string name = Lower(it.key());
      const auto& v = it.value();
      if (IsFileColumn(name, file_columns)) {
        if (v.is_null()) continue;
        if (!v.is_string())
          return Status::InvalidArgument(
              fmt::format("{}:{}: '{}' must be a string (a file's path)", where, line, name));
        if (!v.get_ref<const std::string&>().empty()) row.files.push_back({name, v.get<std::string>()});
      } else if (name == "label") {
        if (v.is_number_integer())
          row.label = v.dump();
        else if (v.is_string())
          row.label = v.get<std::string>();
        else if (!v.is_null())
          return Status::InvalidArgument(fmt::format("{}:{}: 'label' must be an integer or a string", where, line));
      } else if (name == "key") {
        if (!v.is_string()) return Status::InvalidArgument(fmt::format("{}:{}: 'key' must be a string", where, line));
        row.key = v.get<std::string>();
      } else if (v.is_string()) {
        row.extra.push_back({name, v.get<std::string>(), ValueType::kString});
      } else if (!v.is_null()) {
        const ValueType type = v.is_number_integer() ? ValueType::kInteger
                               : v.is_number()       ? ValueType::kNumber
                                                     : ValueType::kJson;
        row.extra.push_back({name, v.dump(), type});
      }
    }
    if (row.files.empty())
      return Status::InvalidArgument(fmt::format(
          "{}:{}: no file: {}", where, line,
          file_columns.empty() ? "missing or empty 'path'" : "'path' and every file column are missing or empty"));
    OrderFiles(row.files, file_columns);
    // JSON objects are unordered; keep extra fields in a stable order.
    std::sort(row.extra.begin(), row.extra.end(), [](const Value& a, const Value& b) { return a.column < b.column; });
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace stoker::manifest
