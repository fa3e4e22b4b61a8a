#include "codec/jpeg_coefficients.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <optional>

#include <fmt/format.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "codec/jpeg_huffman.h"
#include "codec/jpeg_internal.h"

// libjpeg's own table builder (jchuff.c), which its optimize_coding pass and
// progressive encoder call: exported by every libjpeg since 6b, declared
// only in a header libjpeg-turbo does not install.
extern "C" void jpeg_gen_optimal_table(j_compress_ptr cinfo, JHUFF_TBL* htbl, long freq[]);

namespace stoker::codec::jpeg_internal {
namespace {

// Zigzag position -> natural position: the order coefficients are coded in.
constexpr std::array<std::uint8_t, 64> kNaturalPosition = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48,
    41, 34, 27, 20, 13, 6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23,
    30, 37, 44, 51, 58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63};

// kZigzagBit[i][b]: the coding-order bits of the coefficients in natural
// positions 8i..8i+7 whose bits are set in b.
constexpr auto kZigzagBit = [] {
  std::array<std::uint8_t, 64> zigzag{};
  for (int k = 0; k < 64; ++k) zigzag[kNaturalPosition[static_cast<std::size_t>(k)]] = static_cast<std::uint8_t>(k);
  std::array<std::array<std::uint64_t, 256>, 8> table{};
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t b = 0; b < 256; ++b)
      for (std::size_t j = 0; j < 8; ++j)
        if (b & (std::size_t{1} << j)) table[i][b] |= std::uint64_t{1} << zigzag[8 * i + j];
  return table;
}();

// Which of a block's coefficients are not zero, as bits in coding order
// (bit k: zigzag position k): found without a branch a coefficient, as most
// are zero, unpredictably.
std::uint64_t NonzeroInZigzagOrder(const JCOEF* block) {
  static_assert(sizeof(JCOEF) == 2);
  std::uint64_t natural = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  for (int i = 0; i < 64; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + i + 8));
    const __m128i zeros = _mm_packs_epi16(_mm_cmpeq_epi16(a, zero), _mm_cmpeq_epi16(b, zero));
    natural |= static_cast<std::uint64_t>(~_mm_movemask_epi8(zeros) & 0xFFFF) << i;
  }
#else
  for (int i = 0; i < 64; ++i) natural |= static_cast<std::uint64_t>(block[i] != 0) << i;
#endif
  std::uint64_t zigzag = 0;
  for (std::size_t i = 0; i < 8; ++i) zigzag |= kZigzagBit[i][(natural >> (8 * i)) & 0xFF];
  return zigzag;
}

// 8-bit JPEG: DC differences take at most 11 bits, AC values 10.
constexpr int kMaxDcBits = 11, kMaxAcBits = 10;

// Symbol counts, 257 a table as jpeg_gen_optimal_table wants them.
using Counts = std::array<long, 257>;

// Counts the symbols of one block coded after a block whose DC was
// `last_dc`, as libjpeg's htest_one_block does; false for a value out of
// range.
bool CountBlock(const JCOEF* block, int last_dc, Counts& dc, Counts& ac) {
  const int dc_bits = std::bit_width(static_cast<unsigned>(std::abs(block[0] - last_dc)));
  if (dc_bits > kMaxDcBits) return false;
  ++dc[static_cast<std::size_t>(dc_bits)];
  std::uint64_t nonzero = NonzeroInZigzagOrder(block) & ~std::uint64_t{1};  // the AC ones
  int last = 0;                                                             // the last coefficient coded
  for (; nonzero != 0; nonzero &= nonzero - 1) {
    const int k = std::countr_zero(nonzero);
    int run = k - last - 1;
    last = k;
    for (; run > 15; run -= 16) ++ac[0xF0];
    const int bits =
        std::bit_width(static_cast<unsigned>(std::abs(block[kNaturalPosition[static_cast<std::size_t>(k)]])));
    if (bits > kMaxAcBits) return false;
    ++ac[static_cast<std::size_t>((run << 4) + bits)];
  }
  if (last < 63) ++ac[0];  // end of block
  return true;
}

int CeilDiv(long a, long b) {
  return static_cast<int>((a + b - 1) / b);
}

// The fast Huffman decoder put in libjpeg's place inside
// jpeg_read_coefficients, through its progress hook: called before each
// iMCU row is read (the first time after the scan's set-up, when the
// decoder can be installed), and once more after the last, when the scan's
// data has been read by a decoder that does not move libjpeg's source: the
// source is then moved to the EOI marker ending the file, for libjpeg to
// read.
struct FastCoefficientRead {
  jpeg_progress_mgr base{};  // first: libjpeg holds a pointer to it
  FastHuffmanDecoder* fast = nullptr;
  const JOCTET* end_marker = nullptr;  // the file's last two bytes, EOI
  bool tried = false, installed = false, moved = false;

  static void Monitor(j_common_ptr common) {
    auto* cinfo = reinterpret_cast<j_decompress_ptr>(common);
    auto* self = reinterpret_cast<FastCoefficientRead*>(cinfo->progress);
    if (!self->tried) {
      self->tried = true;
      self->installed = self->fast->Install(cinfo, /*reading_coefficients=*/true);
      return;
    }
    if (self->installed && !self->moved && cinfo->input_iMCU_row >= cinfo->total_iMCU_rows) {
      self->moved = true;
      cinfo->src->next_input_byte = self->end_marker;
      cinfo->src->bytes_in_buffer = 2;
    }
  }
};

// Reads `jpeg`'s coefficients under d's error handling; `fast` (nullable)
// as above. False with d's message set, or with fast->gave_up().
bool ReadCoefficients(Decompressor* d, std::span<const std::byte> jpeg, FastCoefficientRead* fast,
                      jvirt_barray_ptr** out) {
  if (setjmp(d->err.jump)) return false;
  jpeg_mem_src(&d->cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&d->cinfo, TRUE);
  if (fast != nullptr) {
    fast->base.progress_monitor = FastCoefficientRead::Monitor;
    d->cinfo.progress = &fast->base;
  }
  *out = jpeg_read_coefficients(&d->cinfo);
  return true;
}

Status Differs(std::string_view what) {
  return Status::Corruption(fmt::format("the rewritten JPEG has other {} than the original", what));
}

}  // namespace

Status SetOptimalHuffmanTables(j_decompress_ptr src, jvirt_barray_ptr* coefficients, j_compress_ptr dst) {
  const int components = dst->num_components;
  if (components < 1 || components > MAX_COMPS_IN_SCAN || components != src->num_components)
    return Status::Corruption(fmt::format("{} components cannot be written as one scan", components));
  int max_h = 1, max_v = 1;
  for (int c = 0; c < components; ++c) {
    max_h = std::max(max_h, dst->comp_info[c].h_samp_factor);
    max_v = std::max(max_v, dst->comp_info[c].v_samp_factor);
  }
  struct Component {
    int h = 1, v = 1, width_in_blocks = 0, height_in_blocks = 0;
    Counts* dc = nullptr;
    Counts* ac = nullptr;
  };
  std::array<Component, MAX_COMPS_IN_SCAN> layout;
  std::array<Counts, NUM_HUFF_TBLS> dc_counts{}, ac_counts{};
  for (int c = 0; c < components; ++c) {
    const jpeg_component_info& info = dst->comp_info[c];
    if (info.dc_tbl_no < 0 || info.dc_tbl_no >= NUM_HUFF_TBLS || info.ac_tbl_no < 0 || info.ac_tbl_no >= NUM_HUFF_TBLS)
      return Status::Corruption("a component names no Huffman table");
    Component& component = layout[static_cast<std::size_t>(c)];
    component.h = info.h_samp_factor;
    component.v = info.v_samp_factor;
    // jcmaster.c's initial_setup.
    component.width_in_blocks = CeilDiv(long{dst->image_width} * component.h, long{max_h} * DCTSIZE);
    component.height_in_blocks = CeilDiv(long{dst->image_height} * component.v, long{max_v} * DCTSIZE);
    component.dc = &dc_counts[static_cast<std::size_t>(info.dc_tbl_no)];
    component.ac = &ac_counts[static_cast<std::size_t>(info.ac_tbl_no)];
  }
  const unsigned interval = dst->restart_interval;
  unsigned restarts_to_go = 0;
  std::array<int, MAX_COMPS_IN_SCAN> last_dc{};
  auto next_mcu = [&] {
    if (interval == 0) return;
    if (restarts_to_go == 0) {
      last_dc.fill(0);
      restarts_to_go = interval;
    }
    --restarts_to_go;
  };
  auto out_of_range = [] { return Status::Corruption("a DCT coefficient is out of the range 8-bit JPEG codes"); };
  auto access = [&](int c, int row, int rows) {
    return (*src->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(src), coefficients[c],
                                           static_cast<JDIMENSION>(row), static_cast<JDIMENSION>(rows), FALSE);
  };
  if (components == 1) {
    // Not interleaved: an MCU is one block, and there are no dummy blocks.
    const Component& component = layout[0];
    for (int row = 0; row < component.height_in_blocks; ++row) {
      const JBLOCKROW blocks = access(0, row, 1)[0];
      for (int col = 0; col < component.width_in_blocks; ++col) {
        next_mcu();
        if (!CountBlock(blocks[col], last_dc[0], *component.dc, *component.ac)) return out_of_range();
        last_dc[0] = blocks[col][0];
      }
    }
  } else {
    const int mcus_per_row = CeilDiv(dst->image_width, long{max_h} * DCTSIZE);
    const int mcu_rows = CeilDiv(dst->image_height, long{max_v} * DCTSIZE);
    std::array<JBLOCKARRAY, MAX_COMPS_IN_SCAN> rows{};
    for (int mcu_row = 0; mcu_row < mcu_rows; ++mcu_row) {
      for (int c = 0; c < components; ++c) {
        const int v = layout[static_cast<std::size_t>(c)].v;
        rows[static_cast<std::size_t>(c)] = access(c, mcu_row * v, v);
      }
      for (int mcu = 0; mcu < mcus_per_row; ++mcu) {
        next_mcu();
        for (int c = 0; c < components; ++c) {
          const Component& component = layout[static_cast<std::size_t>(c)];
          int& dc = last_dc[static_cast<std::size_t>(c)];
          for (int y = 0; y < component.v; ++y) {
            const int row = mcu_row * component.v + y;
            for (int x = 0; x < component.h; ++x) {
              const int col = mcu * component.h + x;
              if (row >= component.height_in_blocks || col >= component.width_in_blocks) {
                // A dummy block (jctrans.c): the DC of the block before it,
                // no AC coefficients.
                ++(*component.dc)[0];
                ++(*component.ac)[0];
                continue;
              }
              const JCOEF* block = rows[static_cast<std::size_t>(c)][y][col];
              if (!CountBlock(block, dc, *component.dc, *component.ac)) return out_of_range();
              dc = block[0];
            }
          }
        }
      }
    }
  }
  // One table of each kind a number, in component order (finish_pass_gather):
  // jpeg_gen_optimal_table clobbers the counts it is given.
  std::array<bool, NUM_HUFF_TBLS> dc_done{}, ac_done{};
  for (int c = 0; c < components; ++c) {
    const auto dc = static_cast<std::size_t>(dst->comp_info[c].dc_tbl_no);
    const auto ac = static_cast<std::size_t>(dst->comp_info[c].ac_tbl_no);
    if (!dc_done[dc]) {
      JHUFF_TBL*& table = dst->dc_huff_tbl_ptrs[dc];
      if (table == nullptr) table = jpeg_alloc_huff_table(reinterpret_cast<j_common_ptr>(dst));
      jpeg_gen_optimal_table(dst, table, dc_counts[dc].data());
      dc_done[dc] = true;
    }
    if (!ac_done[ac]) {
      JHUFF_TBL*& table = dst->ac_huff_tbl_ptrs[ac];
      if (table == nullptr) table = jpeg_alloc_huff_table(reinterpret_cast<j_common_ptr>(dst));
      jpeg_gen_optimal_table(dst, table, ac_counts[ac].data());
      ac_done[ac] = true;
    }
  }
  dst->optimize_coding = FALSE;
  return Status::Ok();
}

Status SameCoefficients(j_decompress_ptr original, jvirt_barray_ptr* coefficients,
                        std::span<const std::byte> rewritten) {
  Decompressor d;
  if (!d.created) return d.CreationError();
  jvirt_barray_ptr* read = nullptr;
  const bool ends_with_eoi = rewritten.size() >= 4 && rewritten[rewritten.size() - 2] == std::byte{0xFF} &&
                             rewritten[rewritten.size() - 1] == std::byte{JPEG_EOI};
  FastCoefficientRead fast;
  fast.fast = &ThreadFastHuffmanDecoder();
  const bool use_fast = ends_with_eoi && !FastHuffmanDisabled();
  if (use_fast) fast.end_marker = reinterpret_cast<const JOCTET*>(rewritten.data() + rewritten.size() - 2);
  bool ok = ReadCoefficients(&d, rewritten, use_fast ? &fast : nullptr, &read);
  std::optional<Decompressor> again;  // libjpeg's decoder, where the fast one gave up
  if (!ok && fast.installed && fast.fast->gave_up()) {
    again.emplace();
    if (!again->created) return again->CreationError();
    ok = ReadCoefficients(&*again, rewritten, nullptr, &read);
  }
  const j_decompress_ptr cinfo = again ? &again->cinfo : &d.cinfo;
  if (!ok)
    return Status::Corruption(
        fmt::format("the rewritten JPEG does not decode: {}", again ? again->err.message : d.err.message));
  if (cinfo->image_width != original->image_width || cinfo->image_height != original->image_height)
    return Differs("dimensions");
  if (cinfo->num_components != original->num_components || cinfo->jpeg_color_space != original->jpeg_color_space)
    return Differs("components or colour space");
  for (int c = 0; c < cinfo->num_components; ++c) {
    const jpeg_component_info& a = original->comp_info[c];
    const jpeg_component_info& b = cinfo->comp_info[c];
    if (a.component_id != b.component_id || a.h_samp_factor != b.h_samp_factor || a.v_samp_factor != b.v_samp_factor)
      return Differs("component sampling");
    if (a.quant_table == nullptr || b.quant_table == nullptr ||
        std::memcmp(a.quant_table->quantval, b.quant_table->quantval, sizeof(a.quant_table->quantval)) != 0)
      return Differs("quantisation tables");
    const std::size_t row_bytes = std::size_t{a.width_in_blocks} * sizeof(JBLOCK);
    for (JDIMENSION row = 0; row < a.height_in_blocks; ++row) {
      const JBLOCKROW x = (*original->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(original),
                                                               coefficients[c], row, 1, FALSE)[0];
      const JBLOCKROW y =
          (*cinfo->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(cinfo), read[c], row, 1, FALSE)[0];
      if (std::memcmp(x, y, row_bytes) != 0) return Differs("DCT coefficients");
    }
  }
  return Status::Ok();
}

}  // namespace stoker::codec::jpeg_internal
