#include "codec/jpeg_huffman.h"

#include <cstdlib>
#include <cstring>
#include <memory>

namespace stoker::codec::jpeg_internal {
namespace {

constexpr int kBits = FastHuffmanDecoder::kLookupBits;

// Zigzag position -> natural position, with 16 extra entries as libjpeg has:
// corrupt runs that step past the 64th coefficient write to the last one.
constexpr std::array<std::uint8_t, 80> kNatural = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
    6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31,
    39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

// The run an end-of-block entry of Table::coefficient holds: any k it is
// added to is past the block.
constexpr int kEndOfBlockRun = 128;

// The value of `bits` (s of them) as JPEG codes it: HUFF_EXTEND.
inline int Extend(int bits, int s) {
  return bits < (1 << (s - 1)) ? bits - (1 << s) + 1 : bits;
}

// True when any byte of `w` is 0xFF.
inline bool HasFF(std::uint64_t w) {
  const std::uint64_t x = ~w;
  return ((x - 0x0101010101010101ULL) & ~x & 0x8080808080808080ULL) != 0;
}

// Whether the last marker in [begin, end) is one other than RSTn (looked
// for from the end, where a JPEG's EOI is): then every interval's data,
// the last one's too, is followed by a marker before the buffer ends.
bool MarkerEndsTheLastInterval(const std::uint8_t* begin, const std::uint8_t* end) {
  for (std::ptrdiff_t i = end - begin - 1; i > 0; --i)
    if (begin[i - 1] == 0xFF && begin[i] != 0x00 && begin[i] != 0xFF) return begin[i] < 0xD0 || begin[i] > 0xD7;
  return false;
}

// Builds `out` from a DHT table libjpeg has already checked (its own decoder
// built it in jpeg_start_decompress, refusing bad tables).
void BuildTable(const JHUFF_TBL& source, bool ac, FastHuffmanDecoder::Table& out) {
  static_assert(sizeof(source.bits) == 17 && sizeof(source.huffval) == 256);
  if (out.built && std::memcmp(out.source.data(), source.bits, 17) == 0 &&
      std::memcmp(out.source.data() + 17, source.huffval, 256) == 0)
    return;
  std::memcpy(out.source.data(), source.bits, 17);
  std::memcpy(out.source.data() + 17, source.huffval, 256);
  out.built = true;
  out.lookup.fill(0);
  if (ac) out.coefficient.fill(0);
  int code = 0, index = 0;
  for (int length = 1; length <= 16; ++length) {
    const int count = source.bits[length];
    if (count == 0) {
      out.max_code[static_cast<std::size_t>(length)] = -1;
      out.value_offset[static_cast<std::size_t>(length)] = 0;
    } else {
      out.value_offset[static_cast<std::size_t>(length)] = index - code;
      for (int i = 0; i < count; ++i, ++code, ++index) {
        const int symbol = source.huffval[index];
        if (length > kBits) continue;
        const int shift = kBits - length, first = code << shift;
        for (int j = 0; j < (1 << shift); ++j)
          out.lookup[static_cast<std::size_t>(first + j)] = static_cast<std::uint16_t>(length << 8 | symbol);
        const int run = symbol >> 4, size = symbol & 15;
        if (ac && symbol == 0) {  // end of block: a run past any coefficient
          for (int j = 0; j < (1 << shift); ++j)
            out.coefficient[static_cast<std::size_t>(first + j)] = kEndOfBlockRun << 8 | length;
          continue;
        }
        if (!ac || size == 0 || length + size > kBits) continue;
        for (int j = 0; j < (1 << shift); ++j) {
          const int value = Extend(j >> (shift - size) & ((1 << size) - 1), size);
          out.coefficient[static_cast<std::size_t>(first + j)] =
              static_cast<std::int32_t>(static_cast<std::uint32_t>(value) << 16) | run << 8 | (length + size);
        }
      }
      out.max_code[static_cast<std::size_t>(length)] = code - 1;
    }
    code <<= 1;
  }
  out.max_code[17] = 0x7FFFFFFF;
  std::memcpy(out.symbols.data(), source.huffval, sizeof(source.huffval));
}

}  // namespace

bool FastHuffmanDisabled() {
  static const bool disabled = [] {
    const char* v = std::getenv("STOKER_JPEG_ENTROPY");
    return v != nullptr && std::strcmp(v, "libjpeg") == 0;
  }();
  return disabled;
}

FastHuffmanDecoder& ThreadFastHuffmanDecoder() {
  thread_local std::unique_ptr<FastHuffmanDecoder> decoder;
  if (!decoder) decoder = std::make_unique<FastHuffmanDecoder>();
  return *decoder;
}

bool FastHuffmanDecoder::Install(j_decompress_ptr cinfo, bool reading_coefficients) {
  gave_up_ = false;  // of an earlier decode
  // jpeg_read_coefficients runs in buffered-image mode; a pixel decode here
  // must not (its passes would re-read the scan).
  if (cinfo->progressive_mode || cinfo->arith_code || cinfo->data_precision != 8 ||
      static_cast<bool>(cinfo->buffered_image) != reading_coefficients)
    return false;
  // Sequential: every component appears in one scan, so a first scan of all
  // of them is the only one, and nothing of it has been read yet.
  if (cinfo->comps_in_scan != cinfo->num_components || cinfo->Ss != 0 || cinfo->Se != 63 || cinfo->Ah != 0 ||
      cinfo->Al != 0 || cinfo->output_scanline != 0 || cinfo->unread_marker != 0)
    return false;
  if (cinfo->blocks_in_MCU < 1 || cinfo->blocks_in_MCU > D_MAX_BLOCKS_IN_MCU || cinfo->src == nullptr) return false;
  std::array<bool, 4> dc_built{}, ac_built{};
  for (int b = 0; b < cinfo->blocks_in_MCU; ++b) {
    const int ci = cinfo->MCU_membership[b];
    if (ci < 0 || ci >= cinfo->comps_in_scan) return false;
    const jpeg_component_info* component = cinfo->cur_comp_info[ci];
    const int dc = component->dc_tbl_no, ac = component->ac_tbl_no;
    if (dc < 0 || dc >= 4 || ac < 0 || ac >= 4) return false;
    const JHUFF_TBL* dc_table = cinfo->dc_huff_tbl_ptrs[dc];
    const JHUFF_TBL* ac_table = cinfo->ac_huff_tbl_ptrs[ac];
    if (dc_table == nullptr || ac_table == nullptr) return false;
    if (!dc_built[static_cast<std::size_t>(dc)]) BuildTable(*dc_table, false, dc_[static_cast<std::size_t>(dc)]);
    if (!ac_built[static_cast<std::size_t>(ac)]) BuildTable(*ac_table, true, ac_[static_cast<std::size_t>(ac)]);
    dc_built[static_cast<std::size_t>(dc)] = ac_built[static_cast<std::size_t>(ac)] = true;
    block_dc_[static_cast<std::size_t>(b)] = &dc_[static_cast<std::size_t>(dc)];
    block_ac_[static_cast<std::size_t>(b)] = &ac_[static_cast<std::size_t>(ac)];
    block_component_[static_cast<std::size_t>(b)] = ci;
  }
  const std::uint8_t* data = cinfo->src->next_input_byte;
  const std::uint8_t* data_end = data + cinfo->src->bytes_in_buffer;
  // libjpeg's memory source warns ("Premature end of JPEG file") when its
  // read-ahead reaches the end of the buffer, however few of those bits it
  // needs. A marker stops that read-ahead (0xFF then a byte other than 0x00
  // and 0xFF is one wherever the reader meets it), so with one after the
  // last interval's start the end is never reached. A buffer whose last
  // marker is an RSTn (cut after it) leaves the last interval open, as one
  // with no marker at all does: libjpeg decides those.
  if (!MarkerEndsTheLastInterval(data, data_end)) return false;
  blocks_in_mcu_ = cinfo->blocks_in_MCU;
  cinfo_ = cinfo;
  next_ = data;
  end_ = data_end;
  restart_interval_ = cinfo->restart_interval;
  Reset();
  vtable_.start_pass = StartPass;
  vtable_.decode_mcu = DecodeMcu;
  vtable_.insufficient_data = FALSE;
  cinfo->entropy = &vtable_;
  return true;
}

void FastHuffmanDecoder::StartPass(j_decompress_ptr cinfo) {
  reinterpret_cast<FastHuffmanDecoder*>(cinfo->entropy)->Reset();
}

void FastHuffmanDecoder::Reset() {
  bits_ = 0;
  bit_count_ = padding_bits_ = 0;
  at_marker_ = false;
  last_dc_.fill(0);
  restarts_to_go_ = restart_interval_;
  next_restart_ = 0;
  gave_up_ = false;
}

void FastHuffmanDecoder::GiveUp(j_decompress_ptr cinfo) {
  gave_up_ = true;
  cinfo->err->msg_code = 0;  // JMSG_NOMESSAGE: the caller decodes again rather than report it
  (*cinfo->err->error_exit)(reinterpret_cast<j_common_ptr>(cinfo));
  std::abort();  // error_exit must not return
}

FastHuffmanDecoder::Reader FastHuffmanDecoder::RefillBytewise(Reader r) {
  while (r.count <= 56) {
    if (at_marker_) {  // zeros past a marker, as libjpeg adds them; using any is giving up
      r.count += 8;
      padding_bits_ += 8;
      continue;
    }
    // The data ends without a marker: libjpeg's memory source would warn.
    if (r.next >= end_) GiveUp(cinfo_);
    unsigned byte = *r.next;
    if (byte == 0xFF) {
      const std::uint8_t* after = r.next + 1;
      while (after < end_ && *after == 0xFF) ++after;  // fill bytes
      if (after >= end_) GiveUp(cinfo_);
      if (*after != 0) {
        at_marker_ = true;
        marker_ = *after;
        r.next = after + 1;
        continue;
      }
      // FF 00: a data byte FF. Fill bytes before it (FF FF+ 00) are no
      // encoder's output, and libjpeg decoded such data to other pixels
      // than this reader (a fuzzer finding): libjpeg decides.
      if (after != r.next + 1) GiveUp(cinfo_);
      r.next = after + 1;
    } else {
      ++r.next;
    }
    r.bits |= std::uint64_t{byte} << (56 - r.count);
    r.count += 8;
  }
  return r;
}

// At least 57 bits in `r` after it: 8 bytes at once when none of them is
// 0xFF (no stuffing, no marker), byte by byte otherwise.
inline FastHuffmanDecoder::Reader FastHuffmanDecoder::Refill(Reader r) {
  if (end_ - r.next >= 8 && !at_marker_) {
    std::uint64_t w;
    std::memcpy(&w, r.next, 8);
    w = __builtin_bswap64(w);
    if (!HasFF(w)) {
      r.bits |= w >> r.count;
      r.next += (63 - r.count) >> 3;
      r.count |= 56;
      return r;
    }
  }
  return RefillBytewise(r);
}

int FastHuffmanDecoder::DecodeLong(const Table& table, std::uint64_t bits) {
  const auto top = static_cast<std::int32_t>(bits >> 48);
  for (int length = kBits + 1; length <= 16; ++length) {
    const std::int32_t code = top >> (16 - length);
    if (code <= table.max_code[static_cast<std::size_t>(length)])
      return length << 8 |
             table.symbols[static_cast<std::size_t>(code + table.value_offset[static_cast<std::size_t>(length)]) & 255];
  }
  return 0;  // no code of any length: libjpeg warns (JWRN_HUFF_BAD_CODE)
}

bool FastHuffmanDecoder::Restart() {
  // A clean interval ends here: under a byte of padding left, then the
  // marker, next in sequence, after any fill bytes.
  if (bit_count_ - padding_bits_ >= 8) return false;
  if (!at_marker_) {
    if (next_ >= end_ || *next_ != 0xFF) return false;
    while (next_ < end_ && *next_ == 0xFF) ++next_;
    if (next_ >= end_) return false;
    marker_ = *next_++;
  }
  if (marker_ != JPEG_RST0 + next_restart_) return false;
  bits_ = 0;
  bit_count_ = padding_bits_ = 0;
  at_marker_ = false;
  last_dc_.fill(0);
  next_restart_ = (next_restart_ + 1) & 7;
  restarts_to_go_ = restart_interval_;
  return true;
}

boolean FastHuffmanDecoder::DecodeMcu(j_decompress_ptr cinfo, JBLOCKROW* blocks) {
  auto* self = reinterpret_cast<FastHuffmanDecoder*>(cinfo->entropy);
  if (!self->DecodeMcuImpl(blocks)) self->GiveUp(cinfo);
  return TRUE;
}

bool FastHuffmanDecoder::DecodeMcuImpl(JBLOCKROW* blocks) {
  if (restart_interval_ != 0) {
    if (restarts_to_go_ == 0 && !Restart()) return false;
    --restarts_to_go_;
  }
  // The reader lives in registers here; only the slow refill sees memory.
  Reader r{bits_, bit_count_, next_};
  bool ok = true;
  for (int b = 0; b < blocks_in_mcu_ && ok; ++b) {
    JCOEF* block = blocks != nullptr ? blocks[b][0] : discard_;
    const Table& dc = *block_dc_[static_cast<std::size_t>(b)];
    const Table& ac = *block_ac_[static_cast<std::size_t>(b)];
    if (r.count < 32) r = Refill(r);
    int hit = dc.lookup[r.bits >> (64 - kBits)];
    if (hit == 0 && (hit = DecodeLong(dc, r.bits)) == 0) {
      ok = false;
      break;
    }
    r.bits <<= hit >> 8;
    r.count -= hit >> 8;
    const int symbol = hit & 0xFF;
    int& last = last_dc_[static_cast<std::size_t>(block_component_[static_cast<std::size_t>(b)])];
    if (symbol != 0) {
      const int diff = Extend(static_cast<int>(r.bits >> (64 - symbol)), symbol);
      r.bits <<= symbol;
      r.count -= symbol;
      // libjpeg refuses a DC sum outside int (JERR_BAD_DCT_COEF).
      if ((last >= 0 && diff > 0x7FFFFFFF - last) || (last < 0 && diff < -0x7FFFFFFF - 1 - last)) {
        ok = false;
        break;
      }
      last += diff;
    }
    block[0] = static_cast<JCOEF>(last);
    for (int k = 1; k < 64;) {
      if (r.count < 32) r = Refill(r);
      const std::size_t peek = r.bits >> (64 - kBits);
      if (const std::int32_t whole = ac.coefficient[peek]; whole != 0) {
        const int used = whole & 0xFF;
        r.bits <<= used;
        r.count -= used;
        k += (whole >> 8) & 0xFF;
        if (k >= kEndOfBlockRun) break;
        block[kNatural[static_cast<std::size_t>(k)]] = static_cast<JCOEF>(whole >> 16);
        ++k;
        continue;
      }
      int code = ac.lookup[peek];
      if (code == 0 && (code = DecodeLong(ac, r.bits)) == 0) {
        ok = false;
        break;
      }
      r.bits <<= code >> 8;
      r.count -= code >> 8;
      const int rs = code & 0xFF;
      const int run = rs >> 4, size = rs & 15;
      if (size != 0) {
        k += run;
        const int value = Extend(static_cast<int>(r.bits >> (64 - size)), size);
        r.bits <<= size;
        r.count -= size;
        block[kNatural[static_cast<std::size_t>(k)]] = static_cast<JCOEF>(value);
        ++k;
      } else {
        if (run != 15) break;
        k += 16;
      }
    }
  }
  bits_ = r.bits;
  bit_count_ = r.count;
  next_ = r.next;
  // Bits past a marker were used: libjpeg would warn (JWRN_HIT_MARKER).
  return ok && (padding_bits_ == 0 || bit_count_ >= padding_bits_);
}

}  // namespace stoker::codec::jpeg_internal
