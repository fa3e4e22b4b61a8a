// The index note's class names (see index_note.h).
#include "format/index_note.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
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

BadImagesNoted BadImagesInNote(std::string_view note) {
  if (note.empty()) return {};
  const auto parsed = nlohmann::json::parse(note, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return {};
  const auto it = parsed.find("bad_images");
  if (it == parsed.end() || !it->is_object()) return {};
  BadImagesNoted noted;
  if (const auto kept = it->find("kept"); kept != it->end() && kept->is_number_unsigned())
    noted.kept = kept->get<std::uint64_t>();
  if (const auto named = it->find("named"); named != it->end() && named->is_object() && !named->empty())
    noted.first = named->begin().key();
  return noted;
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

namespace {

nlohmann::ordered_json NoteObject(std::string_view note) {
  if (note.empty()) return nlohmann::ordered_json::object();
  auto parsed = nlohmann::ordered_json::parse(note, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_object()) return parsed;
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  out["note"] = std::string(note);
  return out;
}

std::string Dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

// Where two class-name lists first differ, for the error.
std::string FirstDifference(const nlohmann::ordered_json& a, const nlohmann::ordered_json& b) {
  if (!a.is_array() || !b.is_array()) return fmt::format("{} against {}", Dump(a), Dump(b));
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    if (a[i] != b[i]) return fmt::format("label {} is {} against {}", i, Dump(a[i]), Dump(b[i]));
  return fmt::format("{} classes against {}", a.size(), b.size());
}

}  // namespace

Result<std::string> MergedNote(std::span<const std::string_view> notes, std::span<const std::string> where) {
  std::vector<nlohmann::ordered_json> parts;
  parts.reserve(notes.size());
  for (const auto note : notes) parts.push_back(NoteObject(note));
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  // Class names: the same in every part that records them (labels index them).
  const auto names_of = [](const nlohmann::ordered_json& part) {
    nlohmann::ordered_json names = nlohmann::ordered_json::object();
    for (const char* key : {"classes", "classes_omitted"})
      if (part.contains(key)) names[key] = part[key];
    return names;
  };
  std::optional<std::size_t> named;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const auto names = names_of(parts[i]);
    if (names.empty()) continue;
    if (!named) {
      named = i;
      out.update(names);
      continue;
    }
    const auto reference = names_of(parts[*named]);
    if (names != reference)
      return Status::InvalidArgument(fmt::format(
          "parts '{}' and '{}' name their classes differently ({}): their labels would mean different classes",
          where[*named], where[i],
          FirstDifference(reference.value("classes", nlohmann::ordered_json()),
                          names.value("classes", nlohmann::ordered_json()))));
  }
  // Seekable JPEGs: counts add up.
  nlohmann::ordered_json seekable;
  for (const auto& part : parts) {
    const auto it = part.find("seekable_jpeg");
    if (it == part.end() || !it->is_object()) continue;
    if (seekable.is_null()) {
      seekable = *it;
      continue;
    }
    for (const auto& [key, value] : it->items()) {
      auto mine = seekable.find(key);
      if (mine == seekable.end())
        seekable[key] = value;
      else if (mine->is_number_unsigned() && value.is_number_unsigned())
        *mine = mine->get<std::uint64_t>() + value.get<std::uint64_t>();
    }
  }
  if (!seekable.is_null()) out["seekable_jpeg"] = std::move(seekable);
  // Bad images kept: counts add up, and the smallest names of all parts stay
  // named (keys are unique across parts).
  std::uint64_t bad_kept = 0;
  std::map<std::string, nlohmann::ordered_json> bad_named;
  bool any_bad = false;
  for (const auto& part : parts) {
    const auto it = part.find("bad_images");
    if (it == part.end() || !it->is_object()) continue;
    any_bad = true;
    if (const auto kept = it->find("kept"); kept != it->end() && kept->is_number_unsigned())
      bad_kept += kept->get<std::uint64_t>();
    if (const auto names = it->find("named"); names != it->end() && names->is_object())
      for (const auto& [name, why] : names->items()) bad_named.emplace(name, why);
  }
  if (any_bad) {
    nlohmann::ordered_json smallest = nlohmann::ordered_json::object();
    for (const auto& [name, why] : bad_named) {
      if (smallest.size() == kBadImagesNamedInNote) break;
      smallest[name] = why;
    }
    out["bad_images"] = {{"kept", bad_kept}, {"named", std::move(smallest)}};
  }
  // pack --max-side's counts add up where every part has them (settings stay alike, or are listed below).
  for (const char* key : {"images_reencoded", "images_kept", "reencoded_bytes_before", "reencoded_bytes_after"}) {
    std::uint64_t sum = 0;
    bool everywhere = true;
    for (const auto& part : parts) {
      const auto it = part.find(key);
      everywhere = everywhere && it != part.end() && it->is_number_unsigned();
      if (everywhere) sum += it->get<std::uint64_t>();
    }
    if (everywhere) out[key] = sum;
  }
  // The rest: kept where every part holds it alike, else listed per part.
  // ordered_json finds a key by a linear search: each part's keys are
  // looked up in a hash map instead, so notes of many keys merge in linear
  // time (a note may hold tens of thousands within its 1 MiB).
  std::vector<std::unordered_map<std::string_view, const nlohmann::ordered_json*>> by_key(parts.size());
  std::vector<std::string_view> keys;
  std::unordered_set<std::string_view> seen;
  for (std::size_t i = 0; i < parts.size(); ++i)
    for (const auto& [key, value] : parts[i].items()) {
      by_key[i].emplace(key, &value);
      if (key != "seekable_jpeg" && key != "bad_images" && key != "classes" && key != "classes_omitted" &&
          seen.insert(key).second && !out.contains(key))
        keys.push_back(key);
    }
  const auto find = [&](std::size_t part, std::string_view key) -> const nlohmann::ordered_json* {
    const auto it = by_key[part].find(key);
    return it == by_key[part].end() ? nullptr : it->second;
  };
  nlohmann::ordered_json differing = nlohmann::ordered_json::object();
  // Appended as they are (an ordered_json object is a vector of pairs, and
  // these keys are new to both), since operator[] would search each time.
  auto& out_object = out.get_ref<nlohmann::ordered_json::object_t&>();
  auto& differing_object = differing.get_ref<nlohmann::ordered_json::object_t&>();
  for (const std::string_view key : keys) {
    const nlohmann::ordered_json* first = find(0, key);
    bool alike = first != nullptr;
    for (std::size_t i = 1; i < parts.size() && alike; ++i) {
      const nlohmann::ordered_json* value = find(i, key);
      alike = value != nullptr && *value == *first;
    }
    if (alike) {
      out_object.emplace_back(std::string(key), *first);
      continue;
    }
    nlohmann::ordered_json values = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < parts.size(); ++i) {
      const nlohmann::ordered_json* value = find(i, key);
      values.push_back(value != nullptr ? *value : nlohmann::ordered_json());
    }
    differing_object.emplace_back(std::string(key), std::move(values));
  }
  nlohmann::ordered_json merged = {{"parts", parts.size()}};
  if (!differing.empty()) merged["differing"] = std::move(differing);
  out["merged"] = std::move(merged);
  std::string text = Dump(out);
  if (text.size() > kMaxNoteBytes) {  // past the limit: what differs goes first, then what is alike
    out["merged"].erase("differing");
    text = Dump(out);
  }
  if (text.size() > kMaxNoteBytes) {
    nlohmann::ordered_json kept = nlohmann::ordered_json::object();
    for (const char* key : {"classes", "classes_omitted", "seekable_jpeg", "bad_images"})
      if (out.contains(key)) kept[key] = out[key];
    kept["merged"] = {{"parts", parts.size()}, {"entries_omitted", true}};
    out = std::move(kept);
    text = Dump(out);
  }
  if (text.size() > kMaxNoteBytes && out.contains("classes")) {  // names alone past it: counted, as NoteWithClassNames
    out["classes_omitted"] = out["classes"].size();
    out.erase("classes");
    text = Dump(out);
  }
  if (text.size() > kMaxNoteBytes) {  // a part's note of stoker's kinds never gets here
    out.erase("seekable_jpeg");
    text = Dump(out);
  }
  return text;
}

}  // namespace stoker::index_format
