// A faster Huffman decoder for sequential JPEGs, put in libjpeg's place.
//
// Entropy (Huffman) decoding is most of a JPEG decode's time on photographs
// (59% of the loader's CPU on a seekable pack of ImageNet-like photos), and
// libjpeg-turbo 2.1 takes its slow path in every JPEG with restart markers.
// This decoder produces the same quantised coefficients, block by block, for
// libjpeg's IDCT, upsampling and colour conversion to use: it replaces
// `cinfo->entropy` between jpeg_start_decompress and the first scanline.
//
// It decodes only what is clean: a marker inside an interval's data, data
// that ends early, restart markers missing or out of sequence, bytes between
// an interval's end and its marker, a code no table holds, a DC value out of
// range. On any of these it gives up (`gave_up()`), ending the decode through
// libjpeg's error_exit; the caller then decodes again with libjpeg's own
// decoder, which decides (warns, which we treat as an error, or decodes).
// So a JPEG decodes to exactly libjpeg's pixels or fails exactly as libjpeg
// would. STOKER_JPEG_ENTROPY=libjpeg in the environment turns it off.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>

// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "codec/jpeg.h"
#include "stoker/status.h"

// libjpeg's entropy-decoder interface, which jpeglib.h names and its internal
// header (jpegint.h, not installed by libjpeg-turbo 3) defines: unchanged
// since libjpeg 6b.
struct jpeg_entropy_decoder {
  void (*start_pass)(j_decompress_ptr cinfo);
  boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW* MCU_data);
  boolean insufficient_data;
};

namespace stoker::codec::jpeg_internal {

// Whether STOKER_JPEG_ENTROPY asks for libjpeg's own decoder (read once).
[[nodiscard]] bool FastHuffmanDisabled();

// DecodeJpeg with this decoder where it can (`fast_huffman`) or with
// libjpeg's throughout: tests and benchmarks compare the two. `fast_decoded`
// says whether this decoder decoded it (it took the scan and did not give up).
[[nodiscard]] Status DecodeJpegUsing(std::span<const std::byte> jpeg, Roi roi, int scale, DecodedRegion& out,
                                     bool fast_huffman, bool* fast_decoded = nullptr);

class FastHuffmanDecoder;

// This thread's decoder (its eight tables take about 100 KB), made on first
// use.
[[nodiscard]] FastHuffmanDecoder& ThreadFastHuffmanDecoder();

class FastHuffmanDecoder {
 public:
  static constexpr int kLookupBits = 11;

  // One DHT table, in the forms the decoder reads.
  struct Table {
    // The next kLookupBits bits -> (code length << 8) | symbol; 0 for codes
    // longer than kLookupBits.
    std::array<std::uint16_t, 1 << kLookupBits> lookup;
    // AC tables: the next kLookupBits bits -> a whole coefficient when the
    // code and its value bits fit: (value << 16) | (run << 8) | bits used;
    // 0 otherwise.
    std::array<std::int32_t, 1 << kLookupBits> coefficient;
    // Longer codes, canonically: the largest code of each length, -1 when
    // none, and the offset from a code to its symbol's index.
    std::array<std::int32_t, 18> max_code;
    std::array<std::int32_t, 17> value_offset;
    std::array<std::uint8_t, 256> symbols;
    // The DHT table these were built from (its counts, then its symbols):
    // an image with the same tables as the last skips the building.
    std::array<std::uint8_t, 17 + 256> source;
    bool built = false;
  };

  // Takes libjpeg's place as cinfo's entropy decoder, for a decompressor
  // after jpeg_start_decompress on a memory source (jpeg_mem_src) and before
  // any scanline is read. False, leaving libjpeg's decoder, for scans it
  // does not take: progressive, arithmetic-coded, not 8-bit, or a scan of
  // only some of the components. With `reading_coefficients`, installs it
  // instead for jpeg_read_coefficients (from its progress hook, after the
  // scan's set-up), which decodes into libjpeg's pre-zeroed block arrays.
  [[nodiscard]] bool Install(j_decompress_ptr cinfo, bool reading_coefficients = false);

  // True after the decode ended because this decoder met data it does not
  // take (see the file comment): decode again with libjpeg's decoder.
  [[nodiscard]] bool gave_up() const { return gave_up_; }

 private:
  static void StartPass(j_decompress_ptr cinfo);
  static boolean DecodeMcu(j_decompress_ptr cinfo, JBLOCKROW* blocks);

  void Reset();
  bool DecodeMcuImpl(JBLOCKROW* blocks);
  [[noreturn]] void GiveUp(j_decompress_ptr cinfo);
  bool Restart();
  // The bit reader's state that the hot loop keeps in registers.
  struct Reader {
    std::uint64_t bits;
    int count;
    const std::uint8_t* next;
  };
  Reader Refill(Reader r);
  Reader RefillBytewise(Reader r);
  // (length << 8) | symbol of a code longer than kLookupBits at the top of
  // `bits`; 0 when no code matches.
  static int DecodeLong(const Table& table, std::uint64_t bits);

  // Must be first: libjpeg calls through cinfo->entropy, a pointer to it.
  jpeg_entropy_decoder vtable_{};
  j_decompress_ptr cinfo_ = nullptr;
  std::array<Table, 4> dc_{}, ac_{};
  std::array<const Table*, D_MAX_BLOCKS_IN_MCU> block_dc_{}, block_ac_{};
  std::array<int, D_MAX_BLOCKS_IN_MCU> block_component_{};
  int blocks_in_mcu_ = 0;
  std::array<int, MAX_COMPS_IN_SCAN> last_dc_{};

  // The entropy-coded data, and the bit reader over it: `bits` holds
  // `bit_count` unread bits from its top; below them only the stream's next
  // bits or zeros.
  const std::uint8_t* next_ = nullptr;
  const std::uint8_t* end_ = nullptr;
  std::uint64_t bits_ = 0;
  int bit_count_ = 0;
  int padding_bits_ = 0;  // zero bits added past a marker or the end: consuming any is giving up
  bool at_marker_ = false;
  int marker_ = 0;

  unsigned restart_interval_ = 0, restarts_to_go_ = 0;
  int next_restart_ = 0;
  bool gave_up_ = false;
  JBLOCK discard_{};  // where blocks go when libjpeg skips rows (decode_mcu with no blocks)
};

}  // namespace stoker::codec::jpeg_internal
