// Writing seekable JPEGs: libjpeg's lossless transcoding (the coefficients
// read and written back, as jpegtran does) with a restart interval.
#include <cstring>

#include <fmt/format.h>

#include "codec/jpeg_coefficients.h"
#include "codec/jpeg_internal.h"
#include "codec/jpeg_restart.h"

namespace stoker::codec {
namespace {

using jpeg_internal::Compressor;
using jpeg_internal::Decompressor;
using jpeg_internal::SameCoefficients;
using jpeg_internal::SetOptimalHuffmanTables;

bool IsJfif(const jpeg_saved_marker_ptr m) {
  return m->marker == JPEG_APP0 && m->data_length >= 5 && std::memcmp(m->data, "JFIF", 5) == 0;
}
bool IsAdobe(const jpeg_saved_marker_ptr m) {
  return m->marker == JPEG_APP0 + 14 && m->data_length >= 5 && std::memcmp(m->data, "Adobe", 5) == 0;
}

// What the header says about whether the file can be rewritten.
enum class Readable { kYes, kProgressive, kArithmetic, kCmyk, kOther };

// The body under setjmp: reads the header and coefficients of `jpeg`
// (`coefficients`, in d's memory) and writes them with a restart interval
// into c. Returns false with the libjpeg message in d or c, or with
// `tables` failed.
bool TranscodeImpl(Decompressor* d, Compressor* c, std::span<const std::byte> jpeg, Readable* readable,
                   bool* failed_in_writer, jvirt_barray_ptr** coefficients, Status* tables) {
  *failed_in_writer = false;
  if (setjmp(d->err.jump)) return false;
  jpeg_mem_src(&d->cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_save_markers(&d->cinfo, JPEG_COM, 0xFFFF);
  for (int m = 0; m < 16; ++m) jpeg_save_markers(&d->cinfo, JPEG_APP0 + m, 0xFFFF);
  jpeg_read_header(&d->cinfo, TRUE);
  if (d->cinfo.progressive_mode) {
    *readable = Readable::kProgressive;
    return true;
  }
  if (d->cinfo.arith_code) {
    *readable = Readable::kArithmetic;
    return true;
  }
  if (d->cinfo.jpeg_color_space == JCS_CMYK || d->cinfo.jpeg_color_space == JCS_YCCK) {
    *readable = Readable::kCmyk;
    return true;
  }
  if (d->cinfo.data_precision != 8) {
    *readable = Readable::kOther;
    return true;
  }
  *readable = Readable::kYes;
  *coefficients = jpeg_read_coefficients(&d->cinfo);

  *failed_in_writer = true;
  if (setjmp(c->err.jump)) return false;
  jpeg_mem_dest(&c->cinfo, &c->buffer, &c->size);
  jpeg_copy_critical_parameters(&d->cinfo, &c->cinfo);
  const bool one = d->cinfo.num_components == 1;
  const int mcu_width = one ? 8 : 8 * d->cinfo.max_h_samp_factor;
  const int mcus_per_row = (static_cast<int>(d->cinfo.image_width) + mcu_width - 1) / mcu_width;
  c->cinfo.restart_interval = static_cast<unsigned>(ChooseRestartInterval(mcus_per_row, mcu_width));
  // Optimised Huffman tables, so files do not grow, counted in a pass of our
  // own (libjpeg's optimize_coding would encode the image twice).
  *tables = SetOptimalHuffmanTables(&d->cinfo, *coefficients, &c->cinfo);
  if (!tables->ok()) return false;
  jpeg_write_coefficients(&c->cinfo, *coefficients);
  for (jpeg_saved_marker_ptr m = d->cinfo.marker_list; m != nullptr; m = m->next) {
    // The compressor writes its own JFIF and Adobe markers when the
    // parameters call for them (as jpegtran's marker copy does).
    if (c->cinfo.write_JFIF_header && IsJfif(m)) continue;
    if (c->cinfo.write_Adobe_marker && IsAdobe(m)) continue;
    jpeg_write_marker(&c->cinfo, m->marker, m->data, m->data_length);
  }
  jpeg_finish_compress(&c->cinfo);
  *failed_in_writer = false;
  return true;
}

// Ends d's decompression (its coefficients are then gone) under its error
// handling: false with its message.
bool FinishDecompress(Decompressor* d) {
  if (setjmp(d->err.jump)) return false;
  jpeg_finish_decompress(&d->cinfo);
  return true;
}

}  // namespace

SeekableJpeg MakeSeekableJpeg(std::span<const std::byte> jpeg) {
  SeekableJpeg result;
  auto kept = [&](SeekableOutcome outcome, std::string why) {
    result.outcome = outcome;
    result.why = std::move(why);
    result.bytes.clear();
    result.table.clear();
    return std::move(result);
  };
  if (jpeg.empty()) return kept(SeekableOutcome::kUndecodable, "empty data");
  if (auto other = OtherImageFormat(jpeg)) return kept(SeekableOutcome::kOther, fmt::format("a {} image", *other));
  Decompressor d;
  Compressor c;
  if (!d.created || !c.created) return kept(SeekableOutcome::kOther, "libjpeg could not be initialised");
  Readable readable = Readable::kOther;
  bool in_writer = false;
  jvirt_barray_ptr* coefficients = nullptr;
  Status tables;
  if (!TranscodeImpl(&d, &c, jpeg, &readable, &in_writer, &coefficients, &tables)) {
    if (!tables.ok()) return kept(SeekableOutcome::kOther, fmt::format("cannot rewrite it: {}", tables.message()));
    return in_writer ? kept(SeekableOutcome::kOther, fmt::format("libjpeg cannot rewrite it: {}", c.err.message))
                     : kept(SeekableOutcome::kUndecodable, d.err.message);
  }
  switch (readable) {
    case Readable::kProgressive:
      return kept(SeekableOutcome::kProgressive, "progressive");
    case Readable::kArithmetic:
      return kept(SeekableOutcome::kArithmetic, "arithmetic coding");
    case Readable::kCmyk:
      return kept(SeekableOutcome::kCmyk, "CMYK or YCCK");
    case Readable::kOther:
      return kept(SeekableOutcome::kOther, "not 8-bit samples");
    case Readable::kYes:
      break;
  }
  const auto* begin = reinterpret_cast<const std::byte*>(c.buffer);
  std::vector<std::byte> rewritten(begin, begin + c.size);
  Result<std::vector<std::uint32_t>> table = FindRestartTable(rewritten);
  if (!table.ok()) return kept(SeekableOutcome::kOther, table.status().message());
  // Never assume the rewrite is lossless: read it back and compare what the
  // pixels of any decoder depend on, every coefficient, quantisation table
  // and sampling factor. The original was read by libjpeg's own Huffman
  // decoder and the rewrite is read by the fast one the loader uses, so the
  // check covers that decoder too, on every image packed.
  if (Status same = SameCoefficients(&d.cinfo, coefficients, rewritten); !same.ok())
    return kept(SeekableOutcome::kOther, same.message());
  if (!FinishDecompress(&d)) return kept(SeekableOutcome::kUndecodable, d.err.message);
  result.outcome = SeekableOutcome::kRewritten;
  result.bytes = std::move(rewritten);
  result.table = std::move(*table);
  return result;
}

}  // namespace stoker::codec
