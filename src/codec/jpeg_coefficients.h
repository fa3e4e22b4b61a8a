// Work on a JPEG's quantised DCT coefficients as libjpeg's transcoding API
// holds them (jpeg_read_coefficients: one virtual block array a component,
// in the decompressor's memory pool), for the seekable rewrite:
//
// - the optimal Huffman tables for writing them back, counted in one pass of
//   our own rather than libjpeg's optimize_coding, which runs its whole
//   encoder over the image an extra time (1.7 ms of a 2.3 ms write on a
//   500x375 photo, against about 0.3 ms here, perf's share of the counting);
// - whether a rewritten JPEG holds exactly the same coefficients, read by the
//   fast Huffman decoder the loader uses.
#pragma once

#include <cstddef>
#include <cstdio>
#include <span>

// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "stoker/status.h"

namespace stoker::codec::jpeg_internal {

// Sets `dst`'s Huffman tables to the optimal ones for `coefficients` (read by
// `src`) as jpeg_write_coefficients will code them with `dst`'s parameters:
// one scan of every component, interleaved when there are several, dummy
// blocks at the right and bottom edges, the DC prediction reset at every
// restart interval. The same symbol counts libjpeg's optimize_coding pass
// makes, given to its own jpeg_gen_optimal_table, so the file written is
// byte for byte the one optimize_coding writes; `dst->optimize_coding` is
// turned off. Call after jpeg_copy_critical_parameters(src, dst) and after
// setting `dst->restart_interval`, under `dst`'s error handling (libjpeg
// reports a code length it cannot build through it). Corruption when a
// coefficient is outside what 8-bit JPEG codes.
[[nodiscard]] Status SetOptimalHuffmanTables(j_decompress_ptr src, jvirt_barray_ptr* coefficients, j_compress_ptr dst);

// Ok when `rewritten` decodes to exactly the coefficients `original` read
// (`coefficients`), with the same image size, components, sampling factors,
// colour space and quantisation tables: what a decoder's pixels depend on,
// so any decoder gives both files the same pixels. Read by the fast Huffman
// decoder (libjpeg's when it does not take the data, or when
// STOKER_JPEG_ENTROPY=libjpeg); Corruption saying what differs, or why
// `rewritten` does not read. `rewritten` is one scan ending the file (EOI
// its last two bytes), as jpeg_write_coefficients writes it: the fast
// decoder's read ends at the scan's last MCU, and libjpeg is then sent to
// that EOI.
[[nodiscard]] Status SameCoefficients(j_decompress_ptr original, jvirt_barray_ptr* coefficients,
                                      std::span<const std::byte> rewritten);

}  // namespace stoker::codec::jpeg_internal
