// manifest.json of a checkpoint folder: what files it holds (sizes, xxh3),
// and what was saved beside the tensors. Written last inside the temporary
// folder, so a published folder always has one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "stoker/checkpoint.h"
#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker::checkpoint {

inline constexpr std::string_view kManifestName = "manifest.json";
inline constexpr std::string_view kIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kLatestName = "latest";
inline constexpr std::string_view kLockName = ".lock";
inline constexpr std::string_view kTempPrefix = ".tmp-";

struct ManifestFile {
  std::string name;
  std::uint64_t bytes = 0;
  std::uint64_t xxh3 = 0;
};

struct Manifest {
  std::int64_t step = 0;
  std::vector<ManifestFile> files;
  std::uint64_t tensor_count = 0;
  std::uint64_t tensor_bytes = 0;
  double created_unix_seconds = 0;
  CheckpointExtras extras;
  // A checkpoint written by several ranks (sharded_manifest.h): the
  // "sharded" member, a JSON object kept verbatim (tens of thousands of
  // pieces: listing checkpoints does not parse it). Empty: a plain one.
  std::string sharded_json;
};

// Writes extras.user_json verbatim, after checking that it is valid JSON.
[[nodiscard]] Result<std::string> EncodeManifest(const Manifest& manifest);
// extras.user_json comes back verbatim and is not validated here (listing
// checkpoints needs only the rest): LoadCheckpoint parses it. `work`, when
// given, is added to.
[[nodiscard]] Result<Manifest> DecodeManifest(std::string_view text, std::string_view path,
                                              safetensors::ParseWork* work = nullptr);
[[nodiscard]] Result<Manifest> ReadManifest(FileSystem& fs, const std::string& step_directory,
                                            safetensors::ParseWork* work = nullptr);

// "step-N" <-> N; nullopt when `name` is not of that form.
[[nodiscard]] std::string StepDirectoryName(std::int64_t step);
[[nodiscard]] std::optional<std::int64_t> ParseStepDirectoryName(std::string_view name);

}  // namespace stoker::checkpoint
