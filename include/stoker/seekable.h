// Seekable JPEGs in the index: what a writer records for one (its restart
// table and the image's geometry) and what a reader gets back (the region
// record of index version 7, which lets it read and check only the MCU rows
// a crop covers). Layout in docs/format.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace stoker {

// What the writer of a seekable JPEG's region record knows of the image
// (from its frame header): its size and the height of an MCU in pixels.
struct JpegGeometry {
  std::uint32_t width = 0, height = 0, mcu_height = 0;
  friend bool operator==(const JpegGeometry&, const JpegGeometry&) = default;
};

// What a writer records for a seekable JPEG: its restart table (intervals +
// 1 offsets from the payload's start; empty: none) and the geometry of its
// region record.
struct SeekableTable {
  std::vector<std::uint32_t> offsets;
  JpegGeometry geometry;
};

// A seekable JPEG's region record (version 7). Its payload is cut into
// pieces: the head (bytes before the first interval: markers, tables, the
// scan header) and each MCU row (from its first interval's start to the next
// row's; the last row to the payload's end). A reader that knows the image's
// size plans its crop, reads the head and the rows the crop covers, and
// checks them against `row_checks` and `rest_check`.
struct RegionRecord {
  JpegGeometry geometry;
  // PieceCheck of the sample's other fields' payloads (field-name order),
  // then the head, hashed as one stream.
  std::uint32_t rest_check = 0;
  std::vector<std::uint32_t> row_checks;  // PieceCheck per MCU row
  [[nodiscard]] std::uint32_t rows() const { return static_cast<std::uint32_t>(row_checks.size()); }
  // Where MCU row `row` starts in the payload (row == rows(): its end), for
  // the restart table it belongs to (intervals + 1 offsets, rows() dividing
  // the intervals).
  [[nodiscard]] std::uint64_t RowStart(std::span<const std::uint32_t> table, std::uint32_t row,
                                       std::uint64_t payload_size) const {
    if (row >= rows()) return payload_size;
    return table[static_cast<std::size_t>(row) * ((table.size() - 1) / rows())];
  }
};

}  // namespace stoker
