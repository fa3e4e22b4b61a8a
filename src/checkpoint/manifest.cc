#include "checkpoint/manifest.h"

#include <charconv>
#include <cmath>
#include <optional>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace stoker::checkpoint {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kFormatName = "stoker-checkpoint";
constexpr int kFormatVersion = 1;

std::string Hex64(std::uint64_t v) {
  return fmt::format("{:016x}", v);
}

std::optional<std::uint64_t> ParseHex64(const std::string& s) {
  std::uint64_t v = 0;
  if (s.size() != 16) return std::nullopt;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

bool IsJsonSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// The end of the string starting at text[i] == '"', or npos.
std::size_t SkipString(std::string_view text, std::size_t i) {
  for (++i; i < text.size(); ++i) {
    if (text[i] == '\\') {
      ++i;
    } else if (text[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// The end of the value starting at text[i], or npos. Exact for valid JSON;
// for anything else, the strict parsers that read the parts report it.
std::size_t SkipValue(std::string_view text, std::size_t i) {
  if (i >= text.size()) return std::string_view::npos;
  if (text[i] == '"') return SkipString(text, i);
  if (text[i] != '{' && text[i] != '[') {
    while (i < text.size() && text[i] != ',' && text[i] != '}' && text[i] != ']' && !IsJsonSpace(text[i])) ++i;
    return i;
  }
  int depth = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '"') {
      i = SkipString(text, i);
      if (i == std::string_view::npos) return i;
      continue;
    }
    if (c == '{' || c == '[') ++depth;
    if ((c == '}' || c == ']') && --depth == 0) return i + 1;
    ++i;
  }
  return std::string_view::npos;
}

using Span = std::pair<std::size_t, std::size_t>;

// Where the values of the top-level members "sharded" (optional, written
// before "user") and "user" lie in `text`, found without parsing them;
// nullopt when the scan does not find "user" (malformed, or the key spelled
// with escapes: the tree parse then reads both).
struct BulkMembers {
  std::optional<Span> sharded;
  Span user;
};
std::optional<BulkMembers> FindBulkMembers(std::string_view text) {
  BulkMembers found;
  std::size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && IsJsonSpace(text[i])) ++i;
  };
  skip_space();
  if (i >= text.size() || text[i] != '{') return std::nullopt;
  ++i;
  for (;;) {
    skip_space();
    if (i >= text.size() || text[i] != '"') return std::nullopt;
    const std::size_t key_begin = i;
    i = SkipString(text, i);
    if (i == std::string_view::npos) return std::nullopt;
    const std::string_view key = text.substr(key_begin + 1, i - key_begin - 2);
    skip_space();
    if (i >= text.size() || text[i] != ':') return std::nullopt;
    ++i;
    skip_space();
    const std::size_t value_begin = i;
    i = SkipValue(text, i);
    if (i == std::string_view::npos) return std::nullopt;
    if (key == "sharded") found.sharded = Span{value_begin, i};
    if (key == "user") {
      found.user = Span{value_begin, i};
      return found;
    }
    skip_space();
    if (i >= text.size() || text[i] != ',') return std::nullopt;
    ++i;
  }
}

// An integer member, or a JSON type error: a float such as 1e126 would be
// converted to the integer type with undefined behaviour (found by
// checkpoint_manifest_fuzzer).
template <typename T>
T IntegerOf(const Json& v) {
  if (!v.is_number_integer())
    throw Json::type_error::create(302, fmt::format("type must be an integer, but is {}", v.type_name()), &v);
  return v.get<T>();
}

}  // namespace

std::string StepDirectoryName(std::int64_t step) {
  return fmt::format("step-{}", step);
}

std::optional<std::int64_t> ParseStepDirectoryName(std::string_view name) {
  if (!name.starts_with("step-")) return std::nullopt;
  name.remove_prefix(5);
  std::int64_t step = 0;
  auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), step);
  if (ec != std::errc() || end != name.data() + name.size() || name.empty() || step < 0) return std::nullopt;
  if (StepDirectoryName(step) != fmt::format("step-{}", name)) return std::nullopt;  // no leading zeros or '+'
  return step;
}

Result<std::string> EncodeManifest(const Manifest& m) {
  try {
    Json j;
    j["format"] = kFormatName;
    j["version"] = kFormatVersion;
    j["step"] = m.step;
    j["created_unix_s"] = m.created_unix_seconds;
    j["tensor_count"] = m.tensor_count;
    j["tensor_bytes"] = m.tensor_bytes;
    Json files = Json::array();
    for (const auto& f : m.files) files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3", Hex64(f.xxh3)}});
    j["files"] = std::move(files);
    const auto& e = m.extras;
    if (e.loader_state) {
      const auto& s = *e.loader_state;
      j["loader_state"] = {{"seed", s.seed},
                           {"epoch", s.epoch},
                           {"global_batch_size", s.global_batch_size},
                           {"batches_consumed", s.batches_consumed},
                           {"num_samples", s.num_samples}};
    } else {
      j["loader_state"] = nullptr;
    }
    j["rng_states"] = e.rng_states;
    j["metadata"] = e.metadata;
    j["metric"] = e.metric ? Json(*e.metric) : Json(nullptr);
    // The user's document goes in verbatim: it can be megabytes (the state's
    // structure), and a parse into a tree and a dump would cost ten times
    // the validation. Checked here, on the persist thread, not in Save().
    if (!e.user_json.empty() && !Json::accept(e.user_json))
      return Status::InvalidArgument("the checkpoint's user_json is not valid JSON; nothing was published");
    std::string text = j.dump(1);  // "{\n ...\n}"
    text.resize(text.size() - 2);
    if (!m.sharded_json.empty()) {
      text += ",\n \"sharded\": ";
      text += m.sharded_json;
    }
    text += ",\n \"user\": ";
    text += e.user_json.empty() ? std::string_view("null") : std::string_view(e.user_json);
    text += "\n}\n";
    return text;
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(fmt::format("cannot encode the checkpoint manifest: {}", e.what()));
  }
}

Result<Manifest> DecodeManifest(std::string_view text, std::string_view path, safetensors::ParseWork* work) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("checkpoint manifest '{}': {}", path, what));
  };
  // The user document (megabytes for a state of many tensors) is cut out
  // and kept verbatim; only the rest is parsed into a tree.
  const auto bulk = FindBulkMembers(text);
  std::optional<Span> user_span;
  std::string rest;
  if (bulk) {
    user_span = bulk->user;
    rest.reserve(text.size() + 8);
    std::size_t from = 0;
    if (bulk->sharded) {
      rest.append(text.substr(0, bulk->sharded->first)).append("null");
      from = bulk->sharded->second;
    }
    rest.append(text.substr(from, user_span->first - from)).append("null").append(text.substr(user_span->second));
  }
  const std::string_view tree_text = bulk ? std::string_view(rest) : text;
  if (work) work->json_bytes += tree_text.size();
  Json j = Json::parse(tree_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object (truncated or overwritten?)");
  try {
    if (j.value("format", "") != kFormatName) return bad("not a stoker checkpoint manifest");
    const auto version = j.contains("version") ? IntegerOf<std::int64_t>(j.at("version")) : 0;
    if (version != kFormatVersion)
      return bad(fmt::format("version {} is not supported (this stoker reads version {})", version, kFormatVersion));
    Manifest m;
    m.step = IntegerOf<std::int64_t>(j.at("step"));
    m.created_unix_seconds = j.value("created_unix_s", 0.0);
    m.tensor_count = IntegerOf<std::uint64_t>(j.at("tensor_count"));
    m.tensor_bytes = IntegerOf<std::uint64_t>(j.at("tensor_bytes"));
    for (const auto& f : j.at("files")) {
      ManifestFile file;
      file.name = f.at("name").get<std::string>();
      file.bytes = IntegerOf<std::uint64_t>(f.at("bytes"));
      auto hash = ParseHex64(f.at("xxh3").get<std::string>());
      if (!hash) return bad(fmt::format("file '{}' has a malformed xxh3", file.name));
      file.xxh3 = *hash;
      if (file.name.empty() || file.name.find('/') != std::string::npos || file.name.starts_with("."))
        return bad(fmt::format("file name '{}' is not a plain name", file.name));
      m.files.push_back(std::move(file));
    }
    if (const auto& s = j.at("loader_state"); !s.is_null()) {
      LoaderState state;
      state.seed = IntegerOf<std::uint64_t>(s.at("seed"));
      state.epoch = IntegerOf<std::uint64_t>(s.at("epoch"));
      state.global_batch_size = IntegerOf<std::uint64_t>(s.at("global_batch_size"));
      state.batches_consumed = IntegerOf<std::uint64_t>(s.at("batches_consumed"));
      state.num_samples = IntegerOf<std::uint64_t>(s.at("num_samples"));
      m.extras.loader_state = state;
    }
    m.extras.rng_states = j.at("rng_states").get<std::map<std::string, std::string>>();
    m.extras.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    if (const auto& metric = j.at("metric"); !metric.is_null()) m.extras.metric = metric.get<double>();
    if (bulk && bulk->sharded) {
      if (const auto sharded = text.substr(bulk->sharded->first, bulk->sharded->second - bulk->sharded->first);
          sharded != "null")
        m.sharded_json = sharded;
    } else if (const auto sharded = j.find("sharded"); sharded != j.end() && !sharded->is_null()) {
      m.sharded_json = sharded->dump();
    }
    if (user_span) {
      if (const auto user = text.substr(user_span->first, user_span->second - user_span->first); user != "null")
        m.extras.user_json = user;
    } else if (const auto& user = j.at("user"); !user.is_null()) {
      m.extras.user_json = user.dump();
    }
    return m;
  } catch (const Json::exception& e) {
    return bad(fmt::format("missing or mistyped field: {}", e.what()));
  }
}

Result<Manifest> ReadManifest(FileSystem& fs, const std::string& step_directory, safetensors::ParseWork* work) {
  const std::string path = step_directory + "/" + std::string(kManifestName);
  auto bytes = ReadWholeFile(fs, path);
  if (!bytes.ok()) {
    if (bytes.error().code() == StatusCode::kNotFound)
      return Status::Corruption(fmt::format("checkpoint '{}' has no {}", step_directory, kManifestName));
    return bytes.error();
  }
  return DecodeManifest(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), path, work);
}

}  // namespace stoker::checkpoint
