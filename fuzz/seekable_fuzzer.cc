// Fuzzes seekable JPEGs: the interval assembly under hostile restart
// tables, and the rewrite. The input is 8 bytes of region and scale, a
// table length, the table (u32 offsets), then a JPEG. The region is decoded
// with that table and with the table the JPEG's own markers give; neither
// may crash or read out of bounds, and a re-written JPEG's own table must
// decode wherever the plain decode does. Small inputs are also re-written as pack does,
// and must decode to the original's pixels.
// The JPEG is also decoded as held in part (a read of the crop's rows): its
// head and the bytes between two of the given table's offsets.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/jpeg_huffman.h"
#include "codec/jpeg_restart.h"

namespace {

std::uint16_t U16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | p[1] << 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace stoker::codec;
  if (size < 10) return 0;
  Roi roi{U16(data) % 2048, U16(data + 2) % 2048, 1 + U16(data + 4) % 2048, 1 + U16(data + 6) % 2048};
  const int scale = 1 << (data[8] % 4);
  const std::size_t entries = std::min<std::size_t>(data[9], (size - 10) / 4);
  std::vector<std::uint32_t> table(entries);
  if (entries > 0) std::memcpy(table.data(), data + 10, entries * 4);
  std::span<const std::byte> jpeg(reinterpret_cast<const std::byte*>(data) + 10 + entries * 4, size - 10 - entries * 4);
  // Refuse images the decoder would spend long on (a fuzzer's time, not a bug).
  auto layout = ReadScanLayout(jpeg);
  if (layout.ok() && std::uint64_t(layout->width) * layout->height > 4'000'000) return 0;
  DecodedRegion out;
  std::vector<std::byte> stream;
  const RestartOffsets given{reinterpret_cast<const std::byte*>(table.data()), static_cast<std::uint32_t>(entries)};
  (void)DecodeJpegSeekable(jpeg, given, roi, scale, out, stream);
  if (entries > 0) {
    const std::size_t head = std::min<std::size_t>(table[0], jpeg.size());
    const std::size_t at = std::min<std::size_t>(table[entries / 2], jpeg.size());
    const std::size_t end = std::min<std::size_t>(table[entries - 1], jpeg.size());
    if (at < end) {
      auto use = DecodeJpegSeekable(HeldJpeg(jpeg.first(head), jpeg.subspan(at, end - at), at), given, roi, scale, out,
                                    stream);
      // Held in part, nothing is decoded from bytes not held: no whole-file fallback.
      if (use.ok() && *use != SeekUse::kUsed && *use != SeekUse::kNeedsWhole) __builtin_trap();
    }
  }
  auto found = FindRestartTable(jpeg);
  if (found.ok()) {
    const RestartOffsets own{reinterpret_cast<const std::byte*>(found->data()),
                             static_cast<std::uint32_t>(found->size())};
    (void)DecodeJpegSeekable(jpeg, own, roi, scale, out, stream);
  }
  // What `stoker index` records is a table FindRestartTable found, or none.
  const auto existing = ExistingRestartTable(jpeg);
  if (existing.has_value() && (!found.ok() || *existing != *found)) __builtin_trap();
  if (jpeg.size() < 4096) {
    SeekableJpeg seekable = MakeSeekableJpeg(jpeg);
    if (seekable.outcome == SeekableOutcome::kRewritten) {
      // The rewrite's check compares coefficients; pixels are the oracle
      // here: whole, each decoded by libjpeg's own Huffman decoder.
      DecodedRegion before, after;
      if (!jpeg_internal::DecodeJpegUsing(jpeg, Roi{}, 1, before, /*fast_huffman=*/false).ok() ||
          !jpeg_internal::DecodeJpegUsing(seekable.bytes, Roi{}, 1, after, /*fast_huffman=*/false).ok() ||
          before.width != after.width || before.height != after.height || before.pixels != after.pixels)
        __builtin_trap();
      const RestartOffsets own{reinterpret_cast<const std::byte*>(seekable.table.data()),
                               static_cast<std::uint32_t>(seekable.table.size())};
      auto use = DecodeJpegSeekable(seekable.bytes, own, roi, scale, out, stream);
      // Its own table must fit: wherever the plain decode works, the seekable one does, from the table.
      DecodedRegion plain;
      const bool plain_ok = DecodeJpeg(seekable.bytes, roi, scale, plain).ok();
      if (plain_ok && (!use.ok() || *use == SeekUse::kDisagrees)) __builtin_trap();
      // Held in part (the head and every row), a region inside the image decodes from its own table too.
      const std::span<const std::byte> bytes(seekable.bytes);
      const std::size_t t0 = seekable.table[0];
      auto part = DecodeJpegSeekable(HeldJpeg(bytes.first(t0), bytes.subspan(t0), t0), own, roi, scale, out, stream);
      auto layout_written = ReadScanLayout(bytes);
      if (plain_ok && layout_written.ok() && roi.x < layout_written->width && roi.y < layout_written->height &&
          (!part.ok() || *part != SeekUse::kUsed))
        __builtin_trap();
    }
  }
  return 0;
}
