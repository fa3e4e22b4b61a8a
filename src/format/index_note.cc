// The index note's class names (see index_note.h).
#include "format/index_note.h"

#include <nlohmann/json.hpp>

#include "format/index_format.h"

namespace stoker::index_format {

std::string NoteWithClassNames(std::string_view note, std::span<const std::string> names) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (!note.empty()) {
    auto parsed = nlohmann::ordered_json::parse(note, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object()) {
      out = std::move(parsed);
    } else {
      out["note"] = std::string(note);
    }
  }
  if (names.empty()) return note.empty() ? std::string() : out.dump();
  out["classes"] = names;
  // JSON escapes invalid UTF-8 as an error: names are file or manifest names, kept as they are.
  std::string text = out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  if (text.size() <= kMaxNoteBytes) return text;
  out.erase("classes");
  out["classes_omitted"] = names.size();
  return out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::vector<std::string> ClassNamesInNote(std::string_view note) {
  if (note.empty()) return {};
  const auto parsed = nlohmann::json::parse(note, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return {};
  const auto it = parsed.find("classes");
  if (it == parsed.end() || !it->is_array()) return {};
  std::vector<std::string> names;
  names.reserve(it->size());
  for (const auto& name : *it) {
    if (!name.is_string()) return {};
    names.push_back(name.get<std::string>());
  }
  return names;
}

}  // namespace stoker::index_format
