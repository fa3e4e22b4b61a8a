// Reading seekable JPEGs: the scan's layout, its restart table, and the
// decode of only the intervals a region covers.
#include "codec/jpeg_restart.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

namespace stoker::codec {
namespace {

std::uint8_t At(std::span<const std::byte> b, std::size_t i) {
  return static_cast<std::uint8_t>(b[i]);
}

Status NotSeekable(std::string_view what) {
  return Status::Corruption(fmt::format("not a seekable JPEG: {}", what));
}

constexpr std::uint8_t kRst0 = 0xD0, kEoi = 0xD9;

}  // namespace

Result<ScanLayout> ReadScanLayout(std::span<const std::byte> jpeg) {
  if (jpeg.size() < 4 || At(jpeg, 0) != 0xFF || At(jpeg, 1) != 0xD8) return NotSeekable("no start-of-image marker");
  ScanLayout layout;
  int components = 0, hmax = 0, vmax = 0;
  int ids[4] = {};
  int h[4] = {}, v[4] = {};
  bool frame = false;
  std::size_t at = 2;
  while (true) {
    if (at + 4 > jpeg.size()) return NotSeekable("the header ends before the scan");
    if (At(jpeg, at) != 0xFF) return NotSeekable(fmt::format("no marker at byte {}", at));
    const std::uint8_t marker = At(jpeg, at + 1);
    if (marker == 0xFF) {
      ++at;
      continue;
    }
    if (marker == kEoi || (marker >= kRst0 && marker <= 0xD7) || marker == 0x01 || marker == 0xD8)
      return NotSeekable(fmt::format("marker FF{:02X} at byte {} before the scan", marker, at));
    const std::size_t length = std::size_t{At(jpeg, at + 2)} << 8 | At(jpeg, at + 3);
    if (length < 2 || at + 2 + length > jpeg.size())
      return NotSeekable(fmt::format("marker segment at byte {} runs past the end", at));
    const std::size_t payload = at + 4, payload_size = length - 2;
    auto p = [&](std::size_t i) { return static_cast<int>(At(jpeg, payload + i)); };
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) {
      if (frame) return NotSeekable("two frame headers");
      if (marker != 0xC0 && marker != 0xC1) return NotSeekable(fmt::format("frame type FF{:02X}", marker));
      if (payload_size < 6) return NotSeekable("frame header too short");
      if (p(0) != 8) return NotSeekable(fmt::format("{}-bit samples", p(0)));
      layout.frame_size_at = payload + 1;
      layout.height = p(1) << 8 | p(2);
      layout.width = p(3) << 8 | p(4);
      components = p(5);
      if (layout.width == 0 || layout.height == 0) return NotSeekable("zero width or height");
      if (components < 1 || components > 4) return NotSeekable(fmt::format("{} components", components));
      if (payload_size < 6 + 3 * static_cast<std::size_t>(components))
        return NotSeekable("frame header shorter than its components");
      for (int c = 0; c < components; ++c) {
        ids[c] = p(6 + 3 * c);
        h[c] = p(7 + 3 * c) >> 4;
        v[c] = p(7 + 3 * c) & 0xF;
        if (h[c] < 1 || h[c] > 4 || v[c] < 1 || v[c] > 4)
          return NotSeekable(fmt::format("component {} has sampling factors {}x{}", c, h[c], v[c]));
        hmax = std::max(hmax, h[c]);
        vmax = std::max(vmax, v[c]);
      }
      frame = true;
    } else if (marker == 0xDD) {  // DRI
      if (payload_size != 2) return NotSeekable("restart-interval segment of the wrong size");
      layout.restart_interval = static_cast<std::uint32_t>(p(0) << 8 | p(1));
    } else if (marker == 0xDA) {  // SOS
      if (!frame) return NotSeekable("a scan before the frame header");
      if (payload_size < 1) return NotSeekable("scan header too short");
      const int in_scan = p(0);
      if (in_scan != components)
        return NotSeekable(fmt::format("a scan of {} of the {} components", in_scan, components));
      if (payload_size != 1 + 2 * static_cast<std::size_t>(in_scan) + 3) return NotSeekable("scan header size");
      for (int c = 0; c < in_scan; ++c)
        if (p(1 + 2 * c) != ids[c]) return NotSeekable("scan components out of frame order");
      if (components == 1) {
        // One component: an MCU is one block (its sampling factors do not matter).
        layout.mcu_width = layout.mcu_height = 8;
      } else {
        layout.mcu_width = 8 * hmax;
        layout.mcu_height = 8 * vmax;
      }
      layout.mcus_per_row = (layout.width + layout.mcu_width - 1) / layout.mcu_width;
      layout.mcu_rows = (layout.height + layout.mcu_height - 1) / layout.mcu_height;
      layout.data_at = payload + payload_size;
      return layout;
    }
    at += 2 + length;
  }
}

Result<std::vector<std::uint32_t>> FindRestartTable(std::span<const std::byte> jpeg) {
  STOKER_ASSIGN_OR_RETURN(ScanLayout layout, ReadScanLayout(jpeg));
  if (layout.restart_interval == 0) return NotSeekable("no restart interval");
  if (layout.mcus_per_row % layout.restart_interval != 0)
    return NotSeekable(fmt::format("restart interval {} does not divide a row of {} MCUs", layout.restart_interval,
                                   layout.mcus_per_row));
  if (jpeg.size() > UINT32_MAX) return NotSeekable("larger than 4 GiB");
  const std::uint64_t intervals =
      std::uint64_t{static_cast<std::uint32_t>(layout.mcus_per_row) / layout.restart_interval} *
      static_cast<std::uint32_t>(layout.mcu_rows);
  std::vector<std::uint32_t> table;
  table.reserve(intervals + 1);
  table.push_back(static_cast<std::uint32_t>(layout.data_at));
  const std::uint8_t* base = reinterpret_cast<const std::uint8_t*>(jpeg.data());
  std::size_t i = layout.data_at;
  while (true) {
    const void* hit = i < jpeg.size() ? std::memchr(base + i, 0xFF, jpeg.size() - i) : nullptr;
    if (hit == nullptr || static_cast<const std::uint8_t*>(hit) + 1 >= base + jpeg.size())
      return NotSeekable("the scan has no end-of-image marker");
    i = static_cast<std::size_t>(static_cast<const std::uint8_t*>(hit) - base);
    const std::uint8_t next = base[i + 1];
    if (next == 0x00) {
      i += 2;
    } else if (next == 0xFF) {
      i += 1;  // fill byte
    } else if (next >= kRst0 && next <= 0xD7) {
      const std::size_t k = table.size() - 1;  // the interval this marker ends
      if (next != kRst0 + (k & 7))
        return NotSeekable(fmt::format("marker RST{} at byte {} where RST{} belongs", next - kRst0, i, k & 7));
      if (table.size() > intervals)
        return NotSeekable(fmt::format("more than the {} restart intervals the header gives", intervals));
      i += 2;
      table.push_back(static_cast<std::uint32_t>(i));
    } else if (next == kEoi) {
      if (table.size() != intervals)
        return NotSeekable(fmt::format("{} restart intervals where the header gives {}", table.size(), intervals));
      table.push_back(static_cast<std::uint32_t>(i));
      return table;
    } else {
      return NotSeekable(fmt::format("marker FF{:02X} at byte {} after the scan (a second scan?)", next, i));
    }
  }
}

std::optional<std::vector<std::uint32_t>> ExistingRestartTable(std::span<const std::byte> jpeg) {
  Result<ScanLayout> layout = ReadScanLayout(jpeg);
  if (!layout.ok() || layout->restart_interval == 0 ||
      layout->mcus_per_row > kMaxIndexedIntervalsPerRow * static_cast<std::int64_t>(layout->restart_interval))
    return std::nullopt;
  Result<std::vector<std::uint32_t>> table = FindRestartTable(jpeg);
  if (!table.ok()) return std::nullopt;
  return std::move(table).value();
}

int ChooseRestartInterval(int mcus_per_row, int mcu_width) {
  int best = mcus_per_row, best_distance = INT32_MAX;
  for (int r = 1; r < mcus_per_row; ++r) {
    if (mcus_per_row % r != 0 || r * mcu_width < 32) continue;
    const int per_row = mcus_per_row / r;
    const int distance = std::abs(per_row - 16);
    if (distance <= best_distance) {  // ties go to the longer interval
      best = r;
      best_distance = distance;
    }
  }
  return best;
}

std::string_view SeekableOutcomeName(SeekableOutcome outcome) {
  switch (outcome) {
    case SeekableOutcome::kRewritten:
      return "rewritten";
    case SeekableOutcome::kProgressive:
      return "progressive";
    case SeekableOutcome::kArithmetic:
      return "arithmetic";
    case SeekableOutcome::kCmyk:
      return "cmyk";
    case SeekableOutcome::kUndecodable:
      return "undecodable";
    case SeekableOutcome::kOther:
      return "other";
  }
  return "other";
}

namespace {

// Whether `table` is exactly the restart table of `jpeg` as `layout` reads
// it: every interval start right after the marker that ends the one before,
// in sequence, the first at the scan's start and the end at EOI. Checking
// every entry (not only the ones a region uses) means a table that agrees
// is the table: RST markers cannot appear inside entropy-coded data. A JPEG
// held in part has the markers it holds checked: those around every
// interval of the rows it holds, which are all a region of them uses.
bool TableAgrees(const HeldJpeg& jpeg, const ScanLayout& layout, RestartOffsets table) {
  if (layout.restart_interval == 0 || layout.mcus_per_row % layout.restart_interval != 0) return false;
  const std::uint64_t intervals =
      std::uint64_t{static_cast<std::uint32_t>(layout.mcus_per_row) / layout.restart_interval} *
      static_cast<std::uint32_t>(layout.mcu_rows);
  if (table.entries != intervals + 1 || table[0] != layout.data_at) return false;
  auto marker_at = [&](std::uint64_t at, std::uint8_t want) {
    const std::byte* p = jpeg.Get(at, at + 2);
    return p == nullptr ? jpeg.partial() : (p[0] == std::byte{0xFF} && p[1] == std::byte{want});
  };
  std::uint32_t previous = table[0];
  for (std::uint32_t k = 1; k < intervals; ++k) {
    const std::uint32_t start = table[k];
    if (start < previous + 2 || !marker_at(start - 2, static_cast<std::uint8_t>(kRst0 + ((k - 1) & 7)))) return false;
    previous = start;
  }
  const std::uint32_t end = table[static_cast<std::uint32_t>(intervals)];
  return end >= previous && marker_at(end, kEoi);
}

void PutU16(std::vector<std::byte>& b, std::size_t at, int value) {
  b[at] = static_cast<std::byte>(value >> 8);
  b[at + 1] = static_cast<std::byte>(value & 0xFF);
}

}  // namespace

SeekableRegion AssembleSeekableRegion(const HeldJpeg& jpeg, RestartOffsets table, Roi roi,
                                      std::vector<std::byte>& stream) {
  SeekableRegion region;
  if (table.empty() || roi.width <= 0 || roi.height <= 0) {
    if (jpeg.partial()) region.use = SeekUse::kNeedsWhole;
    return region;
  }
  Result<ScanLayout> read = ReadScanLayout(jpeg.head);
  if (!read.ok() || !TableAgrees(jpeg, *read, table)) {
    region.use = SeekUse::kDisagrees;
    return region;
  }
  const ScanLayout& L = *read;
  if (roi.x < 0 || roi.y < 0 || roi.x >= L.width || roi.y >= L.height) {
    if (jpeg.partial()) region.use = SeekUse::kNeedsWhole;
    return region;
  }
  const int r = static_cast<int>(L.restart_interval);
  const int right = std::min(roi.x + roi.width, L.width), bottom = std::min(roi.y + roi.height, L.height);
  const int c0 = roi.x / L.mcu_width / r * r;
  const int c1 = std::min(L.mcus_per_row, ((right + L.mcu_width - 1) / L.mcu_width + r - 1) / r * r);
  const int q0 = roi.y / L.mcu_height;
  const int q1 = (bottom + L.mcu_height - 1) / L.mcu_height;
  // Starting at the top with every column: a region decode stops after the
  // last row anyway, and reads no more (held in part, the rows held are
  // assembled all the same).
  if (c0 == 0 && c1 == L.mcus_per_row && q0 == 0 && !jpeg.partial()) return region;

  const int sub_width = c1 == L.mcus_per_row ? L.width - c0 * L.mcu_width : (c1 - c0) * L.mcu_width;
  const int sub_height = q1 == L.mcu_rows ? L.height - q0 * L.mcu_height : (q1 - q0) * L.mcu_height;
  const int per_row = L.mcus_per_row / r;
  const int k0 = c0 / r, k1 = c1 / r;  // intervals [k0, k1) of each row
  std::size_t size = L.data_at + 2;
  for (int q = q0; q < q1; ++q) {
    const std::uint32_t first = static_cast<std::uint32_t>(q * per_row + k0);
    const std::uint32_t last = static_cast<std::uint32_t>(q * per_row + k1);
    if (table[last] < table[first] || jpeg.Get(table[first], table[last]) == nullptr) {
      region.use = SeekUse::kNeedsWhole;  // only a JPEG held in part lacks bytes the table gives
      return region;
    }
    size += table[last] - table[first] + 2;  // the intervals, and at most one marker more
  }
  stream.resize(size);
  std::memcpy(stream.data(), jpeg.head.data(), L.data_at);
  PutU16(stream, L.frame_size_at, sub_height);
  PutU16(stream, L.frame_size_at + 2, sub_width);
  std::size_t at = L.data_at;
  std::uint32_t emitted = 0;
  const std::uint32_t total = static_cast<std::uint32_t>(per_row) * static_cast<std::uint32_t>(L.mcu_rows);
  for (int q = q0; q < q1; ++q) {
    for (int k = k0; k < k1; ++k) {
      const std::uint32_t index = static_cast<std::uint32_t>(q * per_row + k);
      // The interval's data ends before the marker that starts the next one
      // (or at EOI for the image's last).
      const std::uint32_t begin = table[index];
      const std::uint32_t end = index + 1 == total ? table[total] : table[index + 1] - 2;
      if (emitted > 0) {
        stream[at++] = std::byte{0xFF};
        stream[at++] = static_cast<std::byte>(kRst0 + ((emitted - 1) & 7));
      }
      std::memcpy(stream.data() + at, jpeg.Get(begin, end), end - begin);
      at += end - begin;
      ++emitted;
    }
  }
  stream[at++] = std::byte{0xFF};
  stream[at++] = std::byte{kEoi};
  stream.resize(at);
  region.use = SeekUse::kUsed;
  region.x = c0 * L.mcu_width;
  region.y = q0 * L.mcu_height;
  region.width = sub_width;
  region.height = sub_height;
  region.full = {L.width, L.height};
  return region;
}

Result<SeekUse> DecodeJpegSeekable(const HeldJpeg& jpeg, RestartOffsets table, Roi roi, int scale, DecodedRegion& out,
                                   std::vector<std::byte>& stream) {
  auto whole = [&](SeekUse use) -> Result<SeekUse> {
    if (jpeg.partial()) return SeekUse::kNeedsWhole;
    STOKER_RETURN_IF_ERROR(DecodeJpeg(jpeg.head, roi, scale, out));
    return use;
  };
  const SeekableRegion region = AssembleSeekableRegion(jpeg, table, roi, stream);
  if (region.use != SeekUse::kUsed) return whole(region.use);
  const int right = std::min(roi.x + roi.width, region.full.width);
  const int bottom = std::min(roi.y + roi.height, region.full.height);
  const Roi sub{roi.x - region.x, roi.y - region.y, std::min(right, region.x + region.width) - roi.x,
                std::min(bottom, region.y + region.height) - roi.y};
  if (!DecodeJpeg(stream, sub, scale, out).ok()) return whole(SeekUse::kDisagrees);
  out.origin_x += region.x;
  out.origin_y += region.y;
  out.full = region.full;
  return SeekUse::kUsed;
}

}  // namespace stoker::codec
