#include "io/page_cache_room.h"

#include <algorithm>
#include <charconv>
#include <vector>

#include <fmt/format.h>

#include "stoker/byte_size.h"

namespace stoker::io {
namespace {

// Limits at or above this mean "no limit" (cgroup v1 writes 2^63 rounded
// down to a page).
constexpr std::uint64_t kUnlimited = std::uint64_t{1} << 62;

std::optional<std::uint64_t> ParseNumber(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end == text.data()) return std::nullopt;
  return value;
}

// The value of line "name value" (memory.stat) or "name: value kB"
// (meminfo, where `unit` is then 1024).
std::optional<std::uint64_t> Field(std::string_view text, std::string_view name, std::uint64_t unit) {
  while (!text.empty()) {
    const std::size_t eol = std::min(text.find('\n'), text.size());
    std::string_view line = text.substr(0, eol);
    text.remove_prefix(std::min(eol + 1, text.size()));
    if (!line.starts_with(name)) continue;
    line.remove_prefix(name.size());
    if (line.starts_with(':')) line.remove_prefix(1);
    if (line.empty() || (line.front() != ' ' && line.front() != '\t')) continue;  // a longer name
    const auto value = ParseNumber(line);
    if (!value || *value > UINT64_MAX / unit) return std::nullopt;
    return *value * unit;
  }
  return std::nullopt;
}

void Tighten(std::optional<PageCacheRoom>& room, std::uint64_t bytes, std::string limited_by) {
  if (!room || bytes < room->bytes) room = PageCacheRoom{bytes, std::move(limited_by)};
}

std::optional<std::string> ReadText(FileSystem& fs, const std::string& path) {
  auto file = fs.OpenForRead(path);
  if (!file.ok()) return std::nullopt;
  // /proc and cgroup files report size 0: read until a short read.
  std::string text;
  std::vector<std::byte> chunk(16384);
  for (;;) {
    auto n = (*file)->ReadAt(text.size(), chunk);
    if (!n.ok()) return std::nullopt;
    text.append(reinterpret_cast<const char*>(chunk.data()), *n);
    if (*n < chunk.size() || text.size() > (1u << 20)) break;
  }
  return text;
}

}  // namespace

std::optional<PageCacheRoom> PageCacheRoomFrom(std::string_view meminfo, std::span<const CgroupMemoryFiles> levels) {
  std::optional<PageCacheRoom> room;
  if (const auto available = Field(meminfo, "MemAvailable", 1024))
    Tighten(room, *available, "MemAvailable (/proc/meminfo)");
  for (const auto& level : levels) {
    std::optional<std::uint64_t> limit, anon;
    if (level.v2) {
      if (level.max.empty() || level.max.starts_with("max")) continue;
      limit = ParseNumber(level.max);
      anon = Field(level.stat, "anon", 1);
    } else {
      limit = Field(level.stat, "hierarchical_memory_limit", 1);
      anon = Field(level.stat, "total_rss", 1);
    }
    if (!limit || *limit >= kUnlimited) continue;
    const std::uint64_t used = anon.value_or(0);
    Tighten(room, *limit > used ? *limit - used : 0,
            fmt::format("memory cgroup {}: limit {}, {} anonymous", level.path.empty() ? "/" : level.path,
                        FormatBytes(*limit), FormatBytes(used)));
  }
  return room;
}

std::optional<PageCacheRoom> ReadPageCacheRoom(FileSystem& fs, const std::string& root) {
  const auto meminfo = ReadText(fs, root + "/proc/meminfo");
  std::vector<CgroupMemoryFiles> levels;
  if (const auto cgroups = ReadText(fs, root + "/proc/self/cgroup")) {
    std::string_view text = *cgroups;
    while (!text.empty()) {
      const std::size_t eol = std::min(text.find('\n'), text.size());
      const std::string_view line = text.substr(0, eol);
      text.remove_prefix(std::min(eol + 1, text.size()));
      // "ID:CONTROLLERS:PATH": v2's line is "0::PATH"; v1's memory line names "memory".
      const std::size_t c1 = line.find(':'), c2 = line.find(':', c1 + 1);
      if (c1 == std::string_view::npos || c2 == std::string_view::npos) continue;
      const std::string_view controllers = line.substr(c1 + 1, c2 - c1 - 1);
      std::string path(line.substr(c2 + 1));
      if (controllers.empty()) {
        // cgroup v2: this cgroup and each parent (a parent's limit binds too).
        for (std::string at = path;;) {
          CgroupMemoryFiles level;
          level.path = at;
          level.v2 = true;
          const std::string dir = root + "/sys/fs/cgroup" + (at == "/" ? "" : at);
          level.max = ReadText(fs, dir + "/memory.max").value_or("");
          level.stat = ReadText(fs, dir + "/memory.stat").value_or("");
          if (!level.max.empty()) levels.push_back(std::move(level));
          if (at == "/" || at.empty()) break;
          const std::size_t slash = at.rfind('/');
          at = slash == 0 || slash == std::string::npos ? "/" : at.substr(0, slash);
        }
      } else if (("," + std::string(controllers) + ",").find(",memory,") != std::string::npos) {
        // cgroup v1: memory.stat's hierarchical_memory_limit covers the parents.
        CgroupMemoryFiles level;
        level.path = path;
        const std::string dir = root + "/sys/fs/cgroup/memory" + (path == "/" ? "" : path);
        level.stat = ReadText(fs, dir + "/memory.stat").value_or("");
        if (!level.stat.empty()) levels.push_back(std::move(level));
      }
    }
  }
  if (!meminfo && levels.empty()) return std::nullopt;
  return PageCacheRoomFrom(meminfo.value_or(""), levels);
}

}  // namespace stoker::io
