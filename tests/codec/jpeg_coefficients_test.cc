#include "codec/jpeg_coefficients.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/jpeg.h"
#include "codec/jpeg_internal.h"
#include "codec/jpeg_restart.h"
#include "codec/jpeg_test_util.h"

namespace stoker::codec::jpeg_internal {
namespace {

using testing_jpeg::Encode;
using testing_jpeg::EncodeSpec;
using testing_jpeg::Spec;

std::string Name(const EncodeSpec& s) {
  return std::to_string(s.width) + "x" + std::to_string(s.height) + " components " + std::to_string(s.components) +
         " sampling " + std::to_string(s.h) + "x" + std::to_string(s.v);
}

// `jpeg`'s coefficients written back by libjpeg with `restart_interval`,
// optimised either by libjpeg's optimize_coding or by
// SetOptimalHuffmanTables. `edit`, when given, changes the compressor's
// parameters or the coefficients first. Empty when anything fails.
enum class Tables { kLibjpeg, kOurs };
template <typename Edit>
std::vector<std::byte> Transcode(std::span<const std::byte> jpeg, unsigned restart_interval, Tables tables, Edit edit,
                                 std::string* error) {
  Decompressor d;
  Compressor c;
  if (setjmp(d.err.jump)) {
    *error = d.err.message;
    return {};
  }
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&d.cinfo);
  if (setjmp(c.err.jump)) {
    *error = c.err.message;
    return {};
  }
  jpeg_mem_dest(&c.cinfo, &c.buffer, &c.size);
  jpeg_copy_critical_parameters(&d.cinfo, &c.cinfo);
  c.cinfo.restart_interval = restart_interval;
  edit(&d.cinfo, coefficients, &c.cinfo);
  if (tables == Tables::kLibjpeg) {
    c.cinfo.optimize_coding = TRUE;
  } else if (Status s = SetOptimalHuffmanTables(&d.cinfo, coefficients, &c.cinfo); !s.ok()) {
    *error = s.ToString();
    return {};
  }
  jpeg_write_coefficients(&c.cinfo, coefficients);
  jpeg_finish_compress(&c.cinfo);
  const auto* begin = reinterpret_cast<const std::byte*>(c.buffer);
  return std::vector<std::byte>(begin, begin + c.size);
}

std::vector<std::byte> Transcode(std::span<const std::byte> jpeg, unsigned restart_interval, Tables tables,
                                 std::string* error) {
  return Transcode(
      jpeg, restart_interval, tables, [](j_decompress_ptr, jvirt_barray_ptr*, j_compress_ptr) {}, error);
}

// SameCoefficients of `rewritten` against `original`'s coefficients.
Status Compare(std::span<const std::byte> original, std::span<const std::byte> rewritten) {
  Decompressor d;
  if (setjmp(d.err.jump)) return Status::Internal(d.err.message);
  jpeg_mem_src(&d.cinfo, reinterpret_cast<const unsigned char*>(original.data()),
               static_cast<unsigned long>(original.size()));
  jpeg_read_header(&d.cinfo, TRUE);
  jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&d.cinfo);
  return SameCoefficients(&d.cinfo, coefficients, rewritten);
}

TEST(JpegCoefficients, OurTablesWriteTheFileLibjpegsOptimizeCodingWrites) {
  // Every layout the rewrite meets: 4:2:0, 4:2:2, 4:4:4, 4:4:0, 4:1:1,
  // grey (one block an MCU, also with 2x2 sampling declared), sizes leaving
  // dummy blocks at the right and bottom edges, intervals that divide the
  // rows and intervals that do not, none.
  std::vector<EncodeSpec> specs = {Spec(517, 389), Spec(333, 251, 3, 1, 1), Spec(333, 251, 3, 2, 1),
                                   Spec(256, 250, 3, 1, 2), Spec(301, 203, 3, 4, 1), Spec(301, 203, 1), Spec(9, 700),
                                   Spec(700, 9), Spec(16, 16),
                                   // Half or more of the luma blocks are dummies.
                                   Spec(8, 700), Spec(700, 8), Spec(40, 24, 3, 4, 1)};
  specs.push_back(Spec(301, 203, 1));
  specs.back().grey_h = specs.back().grey_v = 2;
  specs.push_back(Spec(400, 300));
  specs.back().optimize = true;
  for (const EncodeSpec& spec : specs) {
    const std::vector<std::byte> original = Encode(spec);
    ASSERT_FALSE(original.empty()) << Name(spec);
    for (unsigned interval : {0u, 1u, 2u, 7u, 16u, 1000u}) {
      std::string error;
      const std::vector<std::byte> libjpeg = Transcode(original, interval, Tables::kLibjpeg, &error);
      ASSERT_FALSE(libjpeg.empty()) << Name(spec) << ": " << error;
      const std::vector<std::byte> ours = Transcode(original, interval, Tables::kOurs, &error);
      ASSERT_FALSE(ours.empty()) << Name(spec) << ": " << error;
      EXPECT_EQ(ours, libjpeg) << Name(spec) << " restart interval " << interval;
      EXPECT_TRUE(Compare(original, ours).ok()) << Name(spec) << " restart interval " << interval;
    }
  }
}

TEST(JpegCoefficients, ACoefficientOutOfRangeIsRefusedNotWritten) {
  const std::vector<std::byte> original = Encode(Spec(64, 48));
  std::string error;
  const auto rewritten = Transcode(
      original, 2, Tables::kOurs,
      [](j_decompress_ptr d, jvirt_barray_ptr* coefficients, j_compress_ptr) {
        JBLOCKARRAY rows =
            (*d->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(d), coefficients[0], 1, 1, TRUE);
        rows[0][3][9] = 1500;  // 11 bits: past what an 8-bit AC coefficient codes
      },
      &error);
  EXPECT_TRUE(rewritten.empty());
  EXPECT_NE(error.find("out of the range"), std::string::npos) << error;
}

TEST(JpegCoefficients, AnyDifferenceThatChangesPixelsIsFoundAndNamed) {
  EncodeSpec spec = Spec(203, 151);
  const std::vector<std::byte> original = Encode(spec);
  std::string error;
  const std::vector<std::byte> same = Transcode(original, 4, Tables::kOurs, &error);
  ASSERT_TRUE(Compare(original, same).ok());
  // Also when libjpeg reads the rewrite, as it does one that does not end
  // at its EOI (a byte after it, which libjpeg never reads).
  std::vector<std::byte> trailing = same;
  trailing.push_back(std::byte{0});
  EXPECT_TRUE(Compare(original, trailing).ok());

  // One coefficient of one block (a chroma one, in the last row) changed by one.
  const auto one_coefficient = Transcode(
      original, 4, Tables::kOurs,
      [](j_decompress_ptr d, jvirt_barray_ptr* coefficients, j_compress_ptr) {
        const JDIMENSION last = d->comp_info[2].height_in_blocks - 1;
        JBLOCKARRAY rows =
            (*d->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(d), coefficients[2], last, 1, TRUE);
        rows[0][d->comp_info[2].width_in_blocks - 1][17] += 1;
      },
      &error);
  ASSERT_FALSE(one_coefficient.empty()) << error;
  Status s = Compare(original, one_coefficient);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("DCT coefficients"), std::string::npos) << s.ToString();

  // The same coefficients under another quantisation table.
  const auto quantisation = Transcode(
      original, 4, Tables::kOurs,
      [](j_decompress_ptr, jvirt_barray_ptr*, j_compress_ptr c) { c->quant_tbl_ptrs[1]->quantval[5] += 1; }, &error);
  ASSERT_FALSE(quantisation.empty()) << error;
  s = Compare(original, quantisation);
  EXPECT_NE(s.message().find("quantisation tables"), std::string::npos) << s.ToString();

  // Another image's sampling, size or components.
  s = Compare(original, Encode(Spec(203, 151, 3, 1, 1)));
  EXPECT_NE(s.message().find("component sampling"), std::string::npos) << s.ToString();
  s = Compare(original, Encode(Spec(204, 151)));
  EXPECT_NE(s.message().find("dimensions"), std::string::npos) << s.ToString();
  s = Compare(original, Encode(Spec(203, 151, 1, 1, 1)));
  EXPECT_NE(s.message().find("components"), std::string::npos) << s.ToString();

  // A rewrite that does not read back: cut short, or a byte of its data flipped.
  std::vector<std::byte> cut(same.begin(), same.begin() + static_cast<std::ptrdiff_t>(same.size() / 2));
  s = Compare(original, cut);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("does not decode"), std::string::npos) << s.ToString();
  std::vector<std::byte> flipped = same;
  flipped[flipped.size() - 200] ^= std::byte{0x10};
  EXPECT_FALSE(Compare(original, flipped).ok());
}

}  // namespace
}  // namespace stoker::codec::jpeg_internal
