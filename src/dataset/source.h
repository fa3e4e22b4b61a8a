// What `stoker pack` reads: a list of samples, each a list of fields whose
// bytes come from a file, a byte range of a file, or inline text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/fields.h"
#include "stoker/file_system.h"
#include "stoker/status.h"

namespace stoker::pack_internal {

struct FieldSource {
  std::string name;  // WebDataset field, e.g. "jpg", "cls"
  enum class Kind : std::uint8_t { kFile, kRange, kInline } kind = Kind::kFile;
  std::string path;                       // kFile, kRange
  std::uint64_t offset = 0;               // kRange
  std::uint64_t size = 0;                 // kRange
  std::string text;                       // kInline
  FieldKind content = FieldKind::kBytes;  // what the bytes are, as the index records it
};

struct SourceSample {
  std::string key;
  std::int64_t label;
  std::string origin;               // where it came from, for messages: a file, manifest:line or shard:offset
  std::vector<FieldSource> fields;  // sorted by name, unique
};

struct SourceListing {
  std::vector<SourceSample> samples;
  std::vector<std::string> class_names;
  std::vector<std::string> warnings;
};

// ImageFolder layout: SRC/<class>/**/<file>.<image extension>.
[[nodiscard]] Result<SourceListing> ListImageFolder(FileSystem& fs, const std::string& root);
// A CSV or JSONL manifest; relative paths are relative to its folder. The
// `path` column's file becomes the field named by its extension ("jpg"), a
// file column's the field "<column>.<extension>" ("mask.png"), as WebDataset
// names a sample's second file.
[[nodiscard]] Result<SourceListing> ListManifest(FileSystem& fs, const std::string& manifest_path,
                                                 std::span<const std::string> file_columns = {});
// Existing tar shards (a path or brace pattern).
[[nodiscard]] Result<SourceListing> ListTarShards(FileSystem& fs, const std::string& pattern);
// Existing tar shards, in the order given.
[[nodiscard]] Result<SourceListing> ListTarFiles(FileSystem& fs, std::span<const std::string> paths);

// WebDataset keys must not contain '.' in their last component: replaces
// dots there with '_'. Fails on an empty last component.
[[nodiscard]] Result<std::string> KeyFromRelativePath(std::string_view relative_path_without_extension);

}  // namespace stoker::pack_internal
