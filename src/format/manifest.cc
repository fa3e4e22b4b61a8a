#include "format/manifest.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

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

}  // namespace

Result<std::vector<Row>> ParseCsv(std::string_view text, std::string_view where) {
  STOKER_ASSIGN_OR_RETURN(auto records, SplitCsv(text, where));
  if (records.empty()) return Status::InvalidArgument(fmt::format("{}: empty manifest (expected a header row)", where));
  const auto& header = records[0].second;
  int path_col = -1, label_col = -1, key_col = -1;
  std::vector<std::string> names;
  for (std::size_t c = 0; c < header.size(); ++c) {
    std::string name = Lower(header[c]);
    if (std::find(names.begin(), names.end(), name) != names.end())
      return Status::InvalidArgument(fmt::format("{}:1: column '{}' appears twice in the header", where, header[c]));
    if (name == "path") path_col = static_cast<int>(c);
    if (name == "label") label_col = static_cast<int>(c);
    if (name == "key") key_col = static_cast<int>(c);
    names.push_back(std::move(name));
  }
  if (path_col < 0)
    return Status::InvalidArgument(
        fmt::format("{}:1: header has no 'path' column (columns: {})", where, fmt::join(header, ", ")));
  std::vector<Row> rows;
  for (std::size_t r = 1; r < records.size(); ++r) {
    auto& [line, fields] = records[r];
    if (fields.size() != header.size()) {
      return Status::InvalidArgument(
          fmt::format("{}:{}: row has {} columns, the header has {}", where, line, fields.size(), header.size()));
    }
    Row row;
    row.line = line;
    for (std::size_t c = 0; c < fields.size(); ++c) {
      if (static_cast<int>(c) == path_col)
        row.path = std::move(fields[c]);
      else if (static_cast<int>(c) == label_col)
        row.label = std::move(fields[c]);
      else if (static_cast<int>(c) == key_col)
        row.key = std::move(fields[c]);
      else
        row.extra.emplace_back(names[c], std::move(fields[c]));
    }
    if (row.path.empty()) return Status::InvalidArgument(fmt::format("{}:{}: empty path", where, line));
    rows.push_back(std::move(row));
  }
  return rows;
}

Result<std::vector<Row>> ParseJsonLines(std::string_view text, std::string_view where) {
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
      if (name == "path") {
        if (!v.is_string()) return Status::InvalidArgument(fmt::format("{}:{}: 'path' must be a string", where, line));
        row.path = v.get<std::string>();
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
      } else if (!v.is_null()) {
        row.extra.emplace_back(name, v.is_string() ? v.get<std::string>() : v.dump());
      }
    }
    if (row.path.empty()) return Status::InvalidArgument(fmt::format("{}:{}: missing or empty 'path'", where, line));
    // JSON objects are unordered; keep extra fields in a stable order.
    std::sort(row.extra.begin(), row.extra.end());
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace stoker::manifest
