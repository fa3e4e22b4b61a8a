#include "checkpoint/manifest.h"

#include <charconv>
#include <cmath>

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
    j["user"] = e.user_json.empty() ? Json(nullptr) : Json::parse(e.user_json);
    return j.dump(1) + "\n";
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(fmt::format("cannot encode the checkpoint manifest: {}", e.what()));
  }
}

Result<Manifest> DecodeManifest(std::string_view text, std::string_view path) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("checkpoint manifest '{}': {}", path, what));
  };
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object (truncated or overwritten?)");
  try {
    if (j.value("format", "") != kFormatName) return bad("not a stoker checkpoint manifest");
    if (j.value("version", 0) != kFormatVersion)
      return bad(fmt::format("version {} is not supported (this stoker reads version {})", j.value("version", 0),
                             kFormatVersion));
    Manifest m;
    m.step = j.at("step").get<std::int64_t>();
    m.created_unix_seconds = j.value("created_unix_s", 0.0);
    m.tensor_count = j.at("tensor_count").get<std::uint64_t>();
    m.tensor_bytes = j.at("tensor_bytes").get<std::uint64_t>();
    for (const auto& f : j.at("files")) {
      ManifestFile file;
      file.name = f.at("name").get<std::string>();
      file.bytes = f.at("bytes").get<std::uint64_t>();
      auto hash = ParseHex64(f.at("xxh3").get<std::string>());
      if (!hash) return bad(fmt::format("file '{}' has a malformed xxh3", file.name));
      file.xxh3 = *hash;
      if (file.name.empty() || file.name.find('/') != std::string::npos || file.name.starts_with("."))
        return bad(fmt::format("file name '{}' is not a plain name", file.name));
      m.files.push_back(std::move(file));
    }
    if (const auto& s = j.at("loader_state"); !s.is_null()) {
      LoaderState state;
      state.seed = s.at("seed").get<std::uint64_t>();
      state.epoch = s.at("epoch").get<std::uint64_t>();
      state.global_batch_size = s.at("global_batch_size").get<std::uint64_t>();
      state.batches_consumed = s.at("batches_consumed").get<std::uint64_t>();
      state.num_samples = s.at("num_samples").get<std::uint64_t>();
      m.extras.loader_state = state;
    }
    m.extras.rng_states = j.at("rng_states").get<std::map<std::string, std::string>>();
    m.extras.metadata = j.at("metadata").get<std::map<std::string, std::string>>();
    if (const auto& metric = j.at("metric"); !metric.is_null()) m.extras.metric = metric.get<double>();
    if (const auto& user = j.at("user"); !user.is_null()) m.extras.user_json = user.dump();
    return m;
  } catch (const Json::exception& e) {
    return bad(fmt::format("missing or mistyped field: {}", e.what()));
  }
}

Result<Manifest> ReadManifest(FileSystem& fs, const std::string& step_directory) {
  const std::string path = step_directory + "/" + std::string(kManifestName);
  auto bytes = ReadWholeFile(fs, path);
  if (!bytes.ok()) {
    if (bytes.error().code() == StatusCode::kNotFound)
      return Status::Corruption(fmt::format("checkpoint '{}' has no {}", step_directory, kManifestName));
    return bytes.error();
  }
  return DecodeManifest(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), path);
}

}  // namespace stoker::checkpoint
