// The index's restart section (versions 5-7): seekable JPEGs' restart
// tables, as varints (versions 6-7) or u32s (5), and each table's region
// record (version 7): reading them back, and writing a record.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/hash.h"
#include "format/index_format.h"
#include "format/index_writer.h"

namespace stoker::index_format {

bool IndexView::ReadRestartEntry(std::uint64_t entry, std::vector<std::uint32_t>& table, RegionRecord* region,
                                 std::span<const std::byte>* stored) const {
  if (stored != nullptr) *stored = {};
  const std::byte* e = restart_section_ + entry * kRestartEntrySize;
  const auto entries = Load<std::uint32_t>(e + 12);
  const auto first = Load<std::uint64_t>(e + 16);
  // A varint takes at least a byte: a count the pool cannot hold is refused before any allocation.
  if (entries < 2 || first > restart_pool_ || restart_pool_ - first < entries) return false;
  const std::byte* pool = restart_section_ + restart_entries_ * kRestartEntrySize;
  if (restart_varints_) {
    const std::span<const std::byte> bytes{pool + first, static_cast<std::size_t>(restart_pool_ - first)};
    std::size_t used = 0;
    if (!ReadRestartVarints(bytes, entries, table, &used)) return false;
    if (region != nullptr && region_records_) {
      const std::size_t region_bytes = ReadRegionRecord(bytes.subspan(used), table, *region);
      if (stored != nullptr && region_bytes > 0) *stored = bytes.first(used + region_bytes);
    }
    return true;
  }
  table.resize(entries);
  std::memcpy(table.data(), pool + first * 4, std::size_t{entries} * 4);  // little-endian, as the host
  return true;
}

bool IndexView::restart_table(std::uint64_t sample, std::uint32_t field, std::vector<std::uint32_t>& table,
                              RegionRecord* region) const {
  table.clear();
  if (region != nullptr) *region = {};
  // Entries are sorted by (sample, field): a binary search. A damaged
  // section gives no table or one the reader refuses, never a wild read.
  std::uint64_t lo = 0, hi = restart_entries_;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo) / 2;
    const std::byte* e = restart_section_ + mid * kRestartEntrySize;
    const auto s = Load<std::uint64_t>(e);
    const auto f = Load<std::uint32_t>(e + 8);
    if (s == sample && f == field) return ReadRestartEntry(mid, table, region);
    if (s < sample || (s == sample && f < field))
      lo = mid + 1;
    else
      hi = mid;
  }
  return false;
}

bool IndexView::restart_table_at(std::uint64_t entry, std::uint64_t* sample, std::uint32_t* field,
                                 std::vector<std::uint32_t>& table, RegionRecord* region) const {
  table.clear();
  if (region != nullptr) *region = {};
  if (entry >= restart_entries_) return false;
  restart_entry_owner(entry, sample, field, nullptr);
  return ReadRestartEntry(entry, table, region);
}

std::span<const std::byte> IndexView::restart_table_bytes(std::uint64_t entry, std::size_t size) const {
  if (entry >= restart_entries_ || !restart_varints_) return {};
  const std::byte* e = restart_section_ + entry * kRestartEntrySize;
  const auto first = Load<std::uint64_t>(e + 16);
  if (first > restart_pool_ || restart_pool_ - first < size) return {};
  return {restart_section_ + restart_entries_ * kRestartEntrySize + first, size};
}

bool IndexView::restart_table_at(std::uint64_t entry, std::uint64_t* sample, std::uint32_t* field,
                                 std::vector<std::uint32_t>& table, RegionRecord& region,
                                 std::span<const std::byte>& stored) const {
  table.clear();
  region = {};
  stored = {};
  if (entry >= restart_entries_) return false;
  restart_entry_owner(entry, sample, field, nullptr);
  return ReadRestartEntry(entry, table, &region, &stored);
}

namespace {

constexpr std::uint32_t kMaxJpegSide = 65535;

// Unsigned LEB128 of at most 5 bytes and 32 bits at bytes[at], advancing `at`.
std::optional<std::uint32_t> ReadVarint(std::span<const std::byte> bytes, std::size_t& at) {
  std::uint64_t value = 0;
  for (int shift = 0;; shift += 7) {
    if (at == bytes.size() || shift > 28) return std::nullopt;
    const auto b = static_cast<std::uint8_t>(bytes[at++]);
    value |= std::uint64_t{b & 0x7Fu} << shift;
    if ((b & 0x80) == 0) break;
  }
  if (value > UINT32_MAX) return std::nullopt;
  return static_cast<std::uint32_t>(value);
}

void AppendVarint(std::uint32_t v, std::vector<std::byte>& out) {
  while (v >= 0x80) {
    out.push_back(static_cast<std::byte>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<std::byte>(v));
}

}  // namespace

std::uint32_t RegionRows(const JpegGeometry& g) {
  if (g.width == 0 || g.height == 0 || g.width > kMaxJpegSide || g.height > kMaxJpegSide) return 0;
  if (g.mcu_height != 8 && g.mcu_height != 16 && g.mcu_height != 24 && g.mcu_height != 32) return 0;
  return (g.height + g.mcu_height - 1) / g.mcu_height;
}

std::size_t IndexView::ReadRegionRecord(std::span<const std::byte> bytes, std::span<const std::uint32_t> table,
                                        RegionRecord& region) {
  region = {};
  std::size_t at = 0;
  const auto width = ReadVarint(bytes, at), height = ReadVarint(bytes, at), mcu_height = ReadVarint(bytes, at);
  if (!width || !height || !mcu_height) return 0;
  const JpegGeometry geometry{*width, *height, *mcu_height};
  const std::uint32_t rows = RegionRows(geometry);
  if (rows == 0 || (table.size() - 1) % rows != 0 || bytes.size() - at < (std::size_t{rows} + 1) * 4) return 0;
  region.geometry = geometry;
  region.rest_check = Load<std::uint32_t>(bytes.data() + at);
  region.row_checks.resize(rows);
  std::memcpy(region.row_checks.data(), bytes.data() + at + 4, std::size_t{rows} * 4);
  return at + (std::size_t{rows} + 1) * 4;
}

std::uint32_t PieceCheck(std::span<const std::byte> bytes) {
  return static_cast<std::uint32_t>(Xxh3(bytes));
}

bool RegionPiecesAgree(const RegionRecord& region, std::span<const std::uint32_t> table, std::uint64_t payload_size,
                       std::span<const std::span<const std::byte>> others, std::span<const std::byte> head,
                       std::uint32_t first_row, std::span<const std::byte> rows) {
  if (region.rows() == 0 || table.size() < 2 || (table.size() - 1) % region.rows() != 0 || head.size() != table[0] ||
      first_row >= region.rows())
    return false;
  Xxh3Stream rest;
  for (const auto& other : others) rest.Update(other);
  rest.Update(head);
  if (static_cast<std::uint32_t>(rest.Digest()) != region.rest_check) return false;
  std::uint64_t at = region.RowStart(table, first_row, payload_size);
  std::size_t used = 0;
  for (std::uint32_t row = first_row; row < region.rows() && used < rows.size(); ++row) {
    const std::uint64_t end = region.RowStart(table, row + 1, payload_size);
    if (end < at || end - at > rows.size() - used) return false;
    const std::size_t size = static_cast<std::size_t>(end - at);
    if (PieceCheck(rows.subspan(used, size)) != region.row_checks[row]) return false;
    used += size;
    at = end;
  }
  return used == rows.size() && !rows.empty();
}

void AppendRestartVarints(std::span<const std::uint32_t> table, std::vector<std::byte>& out) {
  const std::size_t start = out.size();
  out.resize(start + table.size() * 5);  // 5 bytes hold any u32
  std::byte* p = out.data() + start;
  std::uint32_t previous = 0;
  for (const std::uint32_t value : table) {
    std::uint32_t delta = value - previous;  // callers give tables that do not decrease
    previous = value;
    while (delta >= 0x80) {
      *p++ = static_cast<std::byte>((delta & 0x7F) | 0x80);
      delta >>= 7;
    }
    *p++ = static_cast<std::byte>(delta);
  }
  out.resize(static_cast<std::size_t>(p - out.data()));
}

bool ReadRestartVarints(std::span<const std::byte> bytes, std::uint32_t count, std::vector<std::uint32_t>& table,
                        std::size_t* used) {
  table.clear();
  if (count > bytes.size()) return false;  // each value takes a byte at least
  table.resize(count);
  const auto* const begin = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const auto* const end = begin + bytes.size();
  const auto* p = begin;
  std::uint64_t value = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    // An interval's bytes take one or two varint bytes: those without the general loop.
    std::uint32_t delta = 0;
    if (p < end && p[0] < 0x80) {
      delta = *p++;
    } else if (end - p >= 2 && p[1] < 0x80) {
      delta = (p[0] & 0x7Fu) | (std::uint32_t{p[1]} << 7);
      p += 2;
    } else {
      std::size_t at = static_cast<std::size_t>(p - begin);
      const auto read = ReadVarint(bytes, at);
      if (!read) {
        table.clear();
        return false;
      }
      delta = *read;
      p = begin + at;
    }
    value += delta;
    if (value > UINT32_MAX) {
      table.clear();
      return false;
    }
    table[i] = static_cast<std::uint32_t>(value);
  }
  if (used != nullptr) *used = static_cast<std::size_t>(p - begin);
  return true;
}

void AppendRestartTable(std::span<const std::uint32_t> table, const RegionRecord& region, std::vector<std::byte>& out) {
  AppendRestartVarints(table, out);
  AppendVarint(region.geometry.width, out);
  AppendVarint(region.geometry.height, out);
  AppendVarint(region.geometry.mcu_height, out);
  const std::size_t at = out.size();
  out.resize(at + 4 * (std::size_t{1} + region.row_checks.size()));
  std::memcpy(out.data() + at, &region.rest_check, 4);  // little-endian, as the host
  std::memcpy(out.data() + at + 4, region.row_checks.data(), 4 * region.row_checks.size());
}

RegionRecord IndexBuilder::MakeRegionRecord(std::span<const Field> fields, std::size_t i) {
  const Field& jpeg = fields[i];
  if (jpeg.region != nullptr) return *jpeg.region;  // AddSample checked that it fits
  std::vector<std::size_t> others;
  for (std::size_t j = 0; j < fields.size(); ++j)
    if (j != i) others.push_back(j);
  std::sort(others.begin(), others.end(),
            [&](std::size_t a, std::size_t b) { return fields[a].name < fields[b].name; });
  Xxh3Stream rest;
  for (std::size_t j : others) rest.Update(fields[j].payload);
  rest.Update(jpeg.payload.first(jpeg.restarts[0]));
  RegionRecord region;
  region.geometry = jpeg.geometry;
  region.rest_check = static_cast<std::uint32_t>(rest.Digest());
  region.row_checks.resize(RegionRows(jpeg.geometry));
  for (std::uint32_t row = 0; row < region.rows(); ++row) {
    const std::uint64_t begin = region.RowStart(jpeg.restarts, row, jpeg.size);
    const std::uint64_t end = region.RowStart(jpeg.restarts, row + 1, jpeg.size);
    region.row_checks[row] = PieceCheck(jpeg.payload.subspan(begin, end - begin));
  }
  return region;
}

}  // namespace stoker::index_format
