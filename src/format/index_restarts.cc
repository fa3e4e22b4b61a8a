// The index's restart section (versions 5-7): seekable JPEGs' restart
// tables, as varints (versions 6-7) or u32s (5), and each table's region
// record (version 7): reading them back, and writing a record.
#include <algorithm>
#include <cstring>
#include <optional>

#include "core/hash.h"
#include "format/index_format.h"

namespace stoker::index_format {

bool IndexView::ReadRestartEntry(std::uint64_t entry, std::vector<std::uint32_t>& table, RegionRecord* region) const {
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
    if (region != nullptr && region_records_) ReadRegionRecord(bytes.subspan(used), table, *region);
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
  const std::byte* e = restart_section_ + entry * kRestartEntrySize;
  *sample = Load<std::uint64_t>(e);
  *field = Load<std::uint32_t>(e + 8);
  return ReadRestartEntry(entry, table, region);
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

void IndexView::ReadRegionRecord(std::span<const std::byte> bytes, std::span<const std::uint32_t> table,
                                 RegionRecord& region) {
  region = {};
  std::size_t at = 0;
  const auto width = ReadVarint(bytes, at), height = ReadVarint(bytes, at), mcu_height = ReadVarint(bytes, at);
  if (!width || !height || !mcu_height) return;
  const JpegGeometry geometry{*width, *height, *mcu_height};
  const std::uint32_t rows = RegionRows(geometry);
  if (rows == 0 || (table.size() - 1) % rows != 0 || bytes.size() - at < (std::size_t{rows} + 1) * 4) return;
  region.geometry = geometry;
  region.rest_check = Load<std::uint32_t>(bytes.data() + at);
  region.row_checks.resize(rows);
  std::memcpy(region.row_checks.data(), bytes.data() + at + 4, std::size_t{rows} * 4);
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
  std::uint32_t previous = 0;
  for (const std::uint32_t value : table) {
    AppendVarint(value - previous, out);  // callers give tables that do not decrease
    previous = value;
  }
}

bool ReadRestartVarints(std::span<const std::byte> bytes, std::uint32_t count, std::vector<std::uint32_t>& table,
                        std::size_t* used) {
  table.clear();
  if (count > bytes.size()) return false;  // each value takes a byte at least
  table.reserve(count);
  std::size_t at = 0;
  std::uint64_t value = 0;
  for (std::uint32_t i = 0; i < count; ++i) {
    const auto delta = ReadVarint(bytes, at);
    value += delta.value_or(0);
    if (!delta || value > UINT32_MAX) {
      table.clear();
      return false;
    }
    table.push_back(static_cast<std::uint32_t>(value));
  }
  if (used != nullptr) *used = at;
  return true;
}

void IndexBuilder::AppendRegionRecord(std::span<const Field> fields, std::size_t i, std::vector<std::byte>& out) {
  const Field& jpeg = fields[i];
  const JpegGeometry& g = jpeg.geometry;
  AppendVarint(g.width, out);
  AppendVarint(g.height, out);
  AppendVarint(g.mcu_height, out);
  auto put = [&](std::uint32_t v) {
    std::byte b[4];
    std::memcpy(b, &v, 4);  // little-endian, as the host
    out.insert(out.end(), b, b + 4);
  };
  if (jpeg.region != nullptr) {  // AddSample checked that it fits
    put(jpeg.region->rest_check);
    for (const std::uint32_t check : jpeg.region->row_checks) put(check);
    return;
  }
  std::vector<std::size_t> others;
  for (std::size_t j = 0; j < fields.size(); ++j)
    if (j != i) others.push_back(j);
  std::sort(others.begin(), others.end(),
            [&](std::size_t a, std::size_t b) { return fields[a].name < fields[b].name; });
  Xxh3Stream rest;
  for (std::size_t j : others) rest.Update(fields[j].payload);
  rest.Update(jpeg.payload.first(jpeg.restarts[0]));
  put(static_cast<std::uint32_t>(rest.Digest()));
  RegionRecord region;
  region.row_checks.resize(RegionRows(g));
  for (std::uint32_t row = 0; row < region.rows(); ++row) {
    const std::uint64_t begin = region.RowStart(jpeg.restarts, row, jpeg.size);
    const std::uint64_t end = region.RowStart(jpeg.restarts, row + 1, jpeg.size);
    put(PieceCheck(jpeg.payload.subspan(begin, end - begin)));
  }
}

}  // namespace stoker::index_format
