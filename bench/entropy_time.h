// Timing only the Huffman decoding of a JPEG, for the benchmarks: every MCU
// decoded through libjpeg's entropy-decoder interface (cinfo->entropy), with
// libjpeg's own decoder or the fast one (src/codec/jpeg_huffman.h)
// installed, nothing else (no IDCT, no colour, no output).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstring>
#include <vector>

#include "codec/jpeg_huffman.h"
#include "codec/jpeg_internal.h"

namespace stoker_bench {

// Seconds to entropy-decode every MCU of `jpeg`; -1 when it does not decode
// (or, with `fast`, when the fast decoder does not take it or gives up).
inline double EntropySeconds(const std::vector<std::byte>& jpeg, bool fast) {
  using stoker::codec::jpeg_internal::Decompressor;
  static thread_local stoker::codec::jpeg_internal::FastHuffmanDecoder decoder;
  static thread_local std::vector<JBLOCK> blocks(D_MAX_BLOCKS_IN_MCU);
  Decompressor d;
  if (!d.created || setjmp(d.err.jump)) return -1;
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  jpeg_start_decompress(&d.cinfo);
  if (fast && !decoder.Install(&d.cinfo)) return -1;
  JBLOCKROW rows[D_MAX_BLOCKS_IN_MCU];
  for (int b = 0; b < D_MAX_BLOCKS_IN_MCU; ++b) rows[b] = &blocks[static_cast<std::size_t>(b)];
  const std::uint64_t mcus = std::uint64_t{d.cinfo.MCUs_per_row} * d.cinfo.MCU_rows_in_scan;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t m = 0; m < mcus; ++m) {
    std::memset(blocks.data(), 0, sizeof(JBLOCK) * static_cast<std::size_t>(d.cinfo.blocks_in_MCU));
    if (!(*d.cinfo.entropy->decode_mcu)(&d.cinfo, rows)) return -1;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  jpeg_abort_decompress(&d.cinfo);
  return s;
}

}  // namespace stoker_bench
