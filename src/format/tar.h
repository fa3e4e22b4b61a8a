// Reading and writing POSIX tar archives (ustar, with pax and GNU long-name
// extensions), as used by WebDataset shards. Pure functions over bytes: no
// I/O, no threads, easy to fuzz.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "stoker/status.h"

namespace stoker::tar {

inline constexpr std::size_t kBlockSize = 512;

enum class MemberType : std::uint8_t { kRegular, kDirectory, kOther };

struct Member {
  std::string name;  // full path after long-name / pax overrides
  MemberType type = MemberType::kOther;
  std::uint64_t header_offset = 0;  // offset of the first header block (incl. extension headers)
  std::uint64_t data_offset = 0;    // offset of the member's data
  std::uint64_t size = 0;           // data size in bytes
};

// Walks the members of an archive held in memory (typically an mmap).
// Extension headers (pax 'x' and 'g', GNU 'L' and 'K') are consumed and
// applied to the member they describe; Next() only returns real members.
class Reader {
 public:
  // `where` names the archive in error messages (e.g. its path).
  Reader(std::span<const std::byte> archive, std::string where) : archive_(archive), where_(std::move(where)) {}

  // The next member; std::nullopt at the end of the archive (two zero blocks
  // or, as GNU tar tolerates, the end of the bytes at a block boundary).
  // Errors name the archive and the offset of the offending header.
  [[nodiscard]] Result<std::optional<Member>> Next();

  // Where the reader stands: after an error from Next(), the offset of the
  // header it could not read.
  [[nodiscard]] std::uint64_t offset() const { return offset_; }

 private:
  std::span<const std::byte> archive_;
  std::string where_;
  std::uint64_t offset_ = 0;
  bool done_ = false;
};

// Appends the header block(s) for a regular file of `size` bytes named `name`
// to `out`: one ustar block, preceded by a pax extended header when the name
// does not fit ustar's name/prefix fields. Deterministic: mtime 0, mode 0644,
// uid/gid 0, empty user and group names.
[[nodiscard]] Status AppendFileHeader(std::string& out, std::string_view name, std::uint64_t size);

// Bytes of zero padding that follow `size` bytes of member data.
[[nodiscard]] constexpr std::uint64_t PaddingAfter(std::uint64_t size) {
  return (kBlockSize - size % kBlockSize) % kBlockSize;
}

// The end-of-archive marker: two zero blocks.
inline constexpr std::size_t kEndOfArchiveSize = 2 * kBlockSize;

}  // namespace stoker::tar
