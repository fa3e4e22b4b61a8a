// WebDataset's naming rules, and shard-list brace patterns.
#pragma once

#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::wds {

struct KeyAndField {
  std::string key;    // the path up to the first '.' of its last component
  std::string field;  // the rest, lower-cased as WebDataset does by default
};

// Splits a member path exactly as WebDataset's base_plus_ext does:
// `a/b.seg.png` -> {"a/b", "seg.png"}. Returns nullopt where WebDataset finds
// no key (no '.' in the last component), so the member belongs to no sample.
[[nodiscard]] std::optional<KeyAndField> SplitMemberName(std::string_view path);

// WebDataset skips members whose first path component is `__*__`
// (e.g. `__index__`, `__meta__/info.json`).
[[nodiscard]] bool IsMetaMember(std::string_view path);

// Parses a `.cls` payload: ASCII decimal, surrounding whitespace allowed.
[[nodiscard]] std::optional<std::int64_t> ParseLabel(std::string_view text);

// Expands brace patterns as WebDataset and the shell do:
// `data-{000000..000002}.tar` -> data-000000.tar, data-000001.tar,
// data-000002.tar (zero padding kept), and `{a,b}` alternatives. Several
// groups multiply. A pattern without braces expands to itself.
[[nodiscard]] Result<std::vector<std::string>> ExpandBraces(std::string_view pattern);

}  // namespace stoker::wds

#include "format/tar.h"

namespace stoker::wds {

// One sample of a tar archive: adjacent members sharing a key.
struct TarSample {
  std::string key;
  std::uint64_t header_offset = 0;  // of the sample's first member
  struct Field {
    std::string name;
    std::uint64_t header_offset;
    std::uint64_t data_offset;
    std::uint64_t size;
  };
  std::vector<Field> fields;  // in archive order
};

// A member left out as the `webdataset` library leaves it out.
struct SkippedMember {
  std::string name;
  std::uint64_t header_offset = 0;
  std::string_view why;  // "not a regular file", "a __*__ name", "no extension"
};

// Walks `archive` and calls `on_sample` for each sample, in order, yielding
// exactly what webdataset's tar iterator does: non-regular members (links,
// folders, ...), `__*__` names and members without an extension (no key)
// are skipped and reported to `on_skip` (may be empty). Errors name `where`,
// the offset and the key: a field repeated inside one sample, a broken tar.
[[nodiscard]] Status ForEachSample(std::span<const std::byte> archive, const std::string& where,
                                   const std::function<Status(const TarSample&)>& on_sample,
                                   const std::function<void(const SkippedMember&)>& on_skip);

}  // namespace stoker::wds
