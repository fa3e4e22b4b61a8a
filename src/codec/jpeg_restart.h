// Seekable JPEGs (`stoker pack --seekable-jpeg`): a baseline JPEG re-written
// losslessly with a restart marker every few MCUs, so that each restart
// interval decodes on its own. With the byte offset of every interval (the
// restart table, kept in the dataset's index) a reader entropy-decodes only
// the intervals a crop covers instead of every row down to the crop's last.
//
// A restart table is intervals + 1 offsets from the start of the JPEG: where
// each interval's entropy-coded bytes start, then where the last one ends
// (the EOI marker). Interval k (k >= 1) starts right after the marker
// RST((k - 1) mod 8). The intervals tile the MCU rows: each row holds the
// same whole number of them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "codec/jpeg.h"
#include "stoker/seekable.h"
#include "stoker/status.h"

namespace stoker::codec {

// A view of a restart table stored as little-endian u32s (in the index).
struct RestartOffsets {
  const std::byte* data = nullptr;
  std::uint32_t entries = 0;  // intervals + 1; 0: none
  [[nodiscard]] bool empty() const { return entries == 0; }
  [[nodiscard]] std::uint32_t operator[](std::uint32_t i) const {
    std::uint32_t v;
    std::memcpy(&v, data + std::size_t{i} * 4, 4);
    return v;
  }
};

// Where a sequential, Huffman-coded JPEG with one scan of every component
// keeps what a seekable decode needs, read from its markers up to the scan.
struct ScanLayout {
  int width = 0, height = 0;
  std::size_t frame_size_at = 0;  // byte offset of the frame header's height (u16 BE), then width
  int mcu_width = 0, mcu_height = 0;
  int mcus_per_row = 0, mcu_rows = 0;
  std::uint32_t restart_interval = 0;  // in MCUs; 0 without a DRI marker
  std::size_t data_at = 0;             // the first entropy-coded byte
};

// Corruption naming what is not so: a JPEG that is not baseline or
// extended-sequential Huffman with 8-bit samples and one scan holding every
// component, or whose markers are malformed.
[[nodiscard]] Result<ScanLayout> ReadScanLayout(std::span<const std::byte> jpeg);

// What the index's region record keeps of a scan's layout.
[[nodiscard]] inline JpegGeometry IndexGeometry(const ScanLayout& layout) {
  return {static_cast<std::uint32_t>(layout.width), static_cast<std::uint32_t>(layout.height),
          static_cast<std::uint32_t>(layout.mcu_height)};
}

// The restart table of a JPEG written with a restart interval that divides
// its MCU rows: scans the entropy-coded data for its RST markers. Corruption
// when the markers are out of sequence, the scan is followed by another, or
// the interval count is not what the header says.
[[nodiscard]] Result<std::vector<std::uint32_t>> FindRestartTable(std::span<const std::byte> jpeg);

// The restart table to index for a JPEG as it is, not re-written (`stoker
// index` over shards written elsewhere, e.g. by `jpegtran -restart`): the
// table FindRestartTable gives when the JPEG has one and it has at most
// kMaxIndexedIntervalsPerRow intervals to an MCU row (finer ones, down to an
// MCU each, would cost the index more than a crop saves); nothing otherwise,
// as for most JPEGs, which have no restart interval.
inline constexpr int kMaxIndexedIntervalsPerRow = 64;
[[nodiscard]] std::optional<std::vector<std::uint32_t>> ExistingRestartTable(std::span<const std::byte> jpeg);

// Restart interval, in MCUs, for an image `mcus_per_row` MCUs of
// `mcu_width` pixels wide: a divisor of the row, giving intervals of at least
// 32 pixels and about 16 to a row; the whole row when no divisor fits. (On
// ImageNet-like photos, 16 to a row decodes a random crop in 8% less time
// than 8 to a row, for 0.5% more bytes; finer intervals skip more of what a
// crop leaves out, but each costs a marker and about 2 bytes of index.)
[[nodiscard]] int ChooseRestartInterval(int mcus_per_row, int mcu_width);

enum class SeekableOutcome : std::uint8_t {
  kRewritten,    // `bytes` and `table` hold the seekable JPEG
  kProgressive,  // kept as it is
  kArithmetic,
  kCmyk,         // CMYK or YCCK
  kUndecodable,  // does not decode (`why`)
  kOther,        // 12-bit, lossless, a layout libjpeg cannot write as one scan... (`why`)
};
inline constexpr std::size_t kSeekableOutcomes = 6;
[[nodiscard]] std::string_view SeekableOutcomeName(SeekableOutcome outcome);

struct SeekableJpeg {
  SeekableOutcome outcome = SeekableOutcome::kOther;
  std::string why;
  std::vector<std::byte> bytes;      // kRewritten only
  std::vector<std::uint32_t> table;  // kRewritten only
};

// Re-writes `jpeg`'s DCT coefficients with a restart interval (libjpeg's
// jpeg_read_coefficients / jpeg_write_coefficients: the same coefficients
// and quantisation tables, Huffman tables optimised, every APPn and COM
// marker kept) and checks that the result decodes to exactly the original's
// pixels; anything it cannot rewrite (or that would change) is reported,
// never an error.
[[nodiscard]] SeekableJpeg MakeSeekableJpeg(std::span<const std::byte> jpeg);

enum class SeekUse : std::uint8_t {
  kUsed,        // only the intervals covering the region were decoded
  kNotUseful,   // the region needs every interval down to its last row: decoded as DecodeJpeg does
  kDisagrees,   // the table does not fit the JPEG (edited after packing?): decoded whole instead
  kNeedsWhole,  // read in part: the rows held do not serve the region, or do not decode; nothing decoded
};

// The bytes of a seekable JPEG a reader holds: all of it, or, read in part
// (Dataset::FieldRead::Part), its head (the bytes before the first restart
// interval) and a run of whole MCU rows from offset `rows_at` on.
struct HeldJpeg {
  HeldJpeg(std::span<const std::byte> whole) : head(whole) {}     // NOLINT: a whole JPEG is held whole
  HeldJpeg(const std::vector<std::byte>& whole) : head(whole) {}  // NOLINT
  HeldJpeg(std::span<const std::byte> head_bytes, std::span<const std::byte> rows_bytes, std::uint64_t at)
      : head(head_bytes), rows(rows_bytes), rows_at(at) {}
  std::span<const std::byte> head;
  std::span<const std::byte> rows;  // empty: `head` is the whole JPEG
  std::uint64_t rows_at = 0;
  [[nodiscard]] bool partial() const { return !rows.empty(); }
  // The JPEG's bytes [begin, end), or nullptr when they are not all held.
  [[nodiscard]] const std::byte* Get(std::uint64_t begin, std::uint64_t end) const {
    if (begin > end) return nullptr;
    if (end <= head.size()) return head.data() + begin;
    if (partial() && begin >= rows_at && end - rows_at <= rows.size()) return rows.data() + (begin - rows_at);
    return nullptr;
  }
};

// A region of a seekable JPEG as a JPEG of its own: the JPEG's header with
// the frame's size changed, then the intervals covering `roi` (widened to
// whole intervals and MCU rows), their markers renumbered, then EOI. Any
// decoder (libjpeg, nvJPEG) decodes it to the sub-image at (x, y) of
// width x height, the same pixels as the whole image's there except within
// one iMCU of the sub-image's edges that are not the image's (chroma
// upsampling at its borders: callers ask for a margin around what they
// need). `use` says whether `stream` holds it: kNotUseful where the region
// needs every interval down to its last row (or is empty), kDisagrees where
// the table does not fit the JPEG (every offset held is checked against its
// markers), kNeedsWhole where the JPEG is held in part and the region needs
// bytes not held. `stream` is reused to avoid allocations.
struct SeekableRegion {
  SeekUse use = SeekUse::kNotUseful;
  int x = 0, y = 0, width = 0, height = 0;
  ImageSize full;  // the whole image
};
[[nodiscard]] SeekableRegion AssembleSeekableRegion(const HeldJpeg& jpeg, RestartOffsets table, Roi roi,
                                                    std::vector<std::byte>& stream);

// DecodeJpeg of a JPEG with a restart table: a stream of the JPEG's header
// (the frame's size changed) and the intervals covering `roi`, widened to
// whole intervals, their markers renumbered, goes to libjpeg, so entropy
// decoding reads only those bytes. The result holds the same pixels as
// DecodeJpeg's, except within one iMCU of the decoded region's edges where
// those are not the image's (chroma upsampling at a partial decode's edges;
// callers ask for a margin, as for DecodeJpeg). Every table offset is
// checked against the JPEG's markers first: a table that disagrees, or an
// assembled stream that does not decode, falls back to the whole file
// (kDisagrees, for counting); errors are the whole file's, as DecodeJpeg.
// A JPEG held in part has no whole file to fall back to: kNeedsWhole then,
// with nothing decoded (the caller reads it whole). `stream` is reused to
// avoid allocations.
[[nodiscard]] Result<SeekUse> DecodeJpegSeekable(const HeldJpeg& jpeg, RestartOffsets table, Roi roi, int scale,
                                                 DecodedRegion& out, std::vector<std::byte>& stream);

}  // namespace stoker::codec
