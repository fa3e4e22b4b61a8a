// `stoker checkpoint ls|verify`: what a checkpoint directory holds, and
// whether every file still matches its checksum and the safetensors rules.
#include "commands.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "stoker/byte_size.h"
#include "stoker/checkpoint.h"
#include "stoker/sharded_checkpoint.h"
#include "stoker/text.h"

namespace stoker_cli {

int RunCheckpointList(const std::string& directory, bool json) {
  auto list = stoker::ListCheckpoints(directory);
  if (!list.ok()) return Fail(list.error());
  if (json) {
    for (const auto& c : *list) {
      nlohmann::json j = {{"step", c.step}, {"path", c.path}, {"bytes", c.bytes}};
      j["metric"] = c.metric ? nlohmann::json(*c.metric) : nlohmann::json(nullptr);
      fmt::print("{}\n", j.dump());
    }
    return 0;
  }
  if (list->empty()) fmt::print("no checkpoints in {}\n", stoker::Printable(directory));
  for (const auto& c : *list)
    fmt::print("step {:>10}  {:>10}  {}{}\n", c.step, stoker::FormatBytes(c.bytes), stoker::Printable(c.path),
               c.metric ? fmt::format("  metric {}", *c.metric) : "");
  return 0;
}

namespace {

// A sharded checkpoint (written by several ranks): its manifest, the tiling
// of every tensor, and every file read once against its block and file
// checksums. True when sound.
bool VerifySharded(const std::string& target, bool json) {
  auto opened = stoker::ShardedCheckpoint::Open(target);
  stoker::Status s = opened.ok() ? (*opened)->VerifyFiles() : opened.error();
  if (json) {
    nlohmann::json j = {{"path", target}, {"ok", s.ok()}};
    if (s.ok()) {
      j["step"] = (*opened)->step();
      j["tensors"] = (*opened)->tensors().size();
      j["world_size"] = (*opened)->world_size();
    } else {
      j["error"] = s.message();
    }
    fmt::print("{}\n", j.dump());
  } else if (s.ok()) {
    fmt::print("ok       {} (step {}, {}, sharded over {})\n", target, (*opened)->step(),
               stoker::Counted((*opened)->tensors().size(), "tensor", "tensors"),
               stoker::Counted((*opened)->world_size(), "rank", "ranks"));
  } else {
    fmt::print("CORRUPT  {}: {}\n", target, s.message());
  }
  return s.ok();
}

}  // namespace

int RunCheckpointVerify(const std::string& path, bool json) {
  // A step-N folder, or a checkpoint directory (every step-N folder in it).
  std::vector<std::string> targets;
  if (std::filesystem::exists(std::filesystem::path(path) / "manifest.json")) {
    targets.push_back(path);
  } else {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(path, ec))
      if (e.is_directory() && e.path().filename().string().starts_with("step-")) targets.push_back(e.path().string());
    if (ec) {
      fmt::print(stderr, "stoker: error: cannot list '{}': {}\n", path, ec.message());
      return 1;
    }
    std::sort(targets.begin(), targets.end());
    if (targets.empty()) {
      fmt::print(stderr, "stoker: error: no checkpoint (step-N folder or manifest.json) in '{}'\n", path);
      return 1;
    }
  }
  int bad = 0;
  for (const auto& target : targets) {
    if (auto sharded = stoker::IsShardedCheckpoint(target); sharded.ok() && *sharded) {
      bad += !VerifySharded(target, json);
      continue;
    }
    auto loaded = stoker::LoadCheckpoint(target);
    if (json) {
      nlohmann::json j = {{"path", target}, {"ok", loaded.ok()}};
      if (loaded.ok()) {
        j["step"] = loaded->step;
        j["tensors"] = loaded->tensors.size();
      } else {
        j["error"] = loaded.error().message();
      }
      fmt::print("{}\n", j.dump());
    } else if (loaded.ok()) {
      fmt::print("ok       {} (step {}, {})\n", target, loaded->step,
                 stoker::Counted(loaded->tensors.size(), "tensor", "tensors"));
    } else {
      fmt::print("CORRUPT  {}: {}\n", target, loaded.error().message());
    }
    bad += !loaded.ok();
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace stoker_cli
