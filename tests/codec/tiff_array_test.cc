// TIFFs as arrays (DecodeTiffArray): files written here with libtiff in
// every sample type, count, layout, byte order, compression and predictor
// decode to exactly the samples written, in tifffile's shapes
// (tests/python/test_tiff_arrays.py compares tifffile's own files); pages
// stack, overviews are skipped, and what is not loaded is refused by name.
#include <tiffio.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/array_decode.h"
#include "codec/tiff.h"
#include "codec/tiff_test_util.h"
#include "test_util.h"

namespace stoker::codec {
namespace {

using testing::TempDir;
using tiff_testing::Bytes;
using tiff_testing::Layout;
using tiff_testing::WriteTiffPages;

Layout Bands(int spp, int bits, int format) {
  Layout l;
  l.spp = spp;
  l.bits = bits;
  l.format = format;
  l.photometric = PHOTOMETRIC_MINISBLACK;
  return l;
}

std::vector<std::int64_t> ShapeOf(const Layout& l, std::size_t pages) {
  std::vector<std::int64_t> shape;
  if (pages > 1) shape.push_back(static_cast<std::int64_t>(pages));
  const bool planar = l.planar == PLANARCONFIG_SEPARATE && l.spp > 1;
  if (planar) shape.push_back(l.spp);
  shape.push_back(l.height);
  shape.push_back(l.width);
  if (!planar && l.spp > 1) shape.push_back(l.spp);
  return shape;
}

// Decodes pages written as `pages` and checks every byte against them.
void ExpectSamplesAsWritten(const std::string& path, const std::vector<Layout>& pages, ElementType type,
                            bool big_endian = false) {
  std::vector<std::vector<std::uint8_t>> written;
  const std::string file = WriteTiffPages(path, pages, written, big_endian);
  HostTensor t;
  ASSERT_OK(DecodeArrayTensor(Bytes(file), 0, &t));
  EXPECT_EQ(t.type, type) << path;
  EXPECT_EQ(t.shape, ShapeOf(pages[0], pages.size())) << path;
  std::vector<std::uint8_t> all;
  for (const auto& page : written) all.insert(all.end(), page.begin(), page.end());
  ASSERT_EQ(t.data.size(), all.size()) << path;
  EXPECT_EQ(std::memcmp(t.data.data(), all.data(), all.size()), 0) << path;
}

TEST(TiffArray, EveryTypeCountLayoutAndByteOrderDecodesToTheSamplesWritten) {
  TempDir dir;
  const struct {
    int bits, format;
    ElementType type;
  } types[] = {
      {8, SAMPLEFORMAT_UINT, ElementType::kUInt8},      {16, SAMPLEFORMAT_UINT, ElementType::kUInt16},
      {32, SAMPLEFORMAT_UINT, ElementType::kUInt32},    {64, SAMPLEFORMAT_UINT, ElementType::kUInt64},
      {8, SAMPLEFORMAT_INT, ElementType::kInt8},        {16, SAMPLEFORMAT_INT, ElementType::kInt16},
      {32, SAMPLEFORMAT_INT, ElementType::kInt32},      {64, SAMPLEFORMAT_INT, ElementType::kInt64},
      {16, SAMPLEFORMAT_IEEEFP, ElementType::kFloat16}, {32, SAMPLEFORMAT_IEEEFP, ElementType::kFloat32},
      {64, SAMPLEFORMAT_IEEEFP, ElementType::kFloat64},
  };
  int n = 0;
  for (const auto& type : types)
    for (int spp : {1, 4, 13})
      for (bool planar : {false, true})
        for (bool tiled : {false, true})
          for (bool big_endian : {false, true}) {
            if (planar && spp == 1) continue;
            Layout l = Bands(spp, type.bits, type.format);
            l.planar = planar ? PLANARCONFIG_SEPARATE : PLANARCONFIG_CONTIG;
            l.tiled = tiled;
            ExpectSamplesAsWritten(dir / ("t" + std::to_string(n++) + ".tif"), {l}, type.type, big_endian);
          }
}

TEST(TiffArray, CompressionsAndPredictorsDecodeToTheSamplesWritten) {
  TempDir dir;
  int n = 0;
  for (int compression : {COMPRESSION_LZW, COMPRESSION_ADOBE_DEFLATE, COMPRESSION_PACKBITS, COMPRESSION_ZSTD}) {
    if (!TIFFIsCODECConfigured(static_cast<std::uint16_t>(compression))) continue;
    Layout u16 = Bands(6, 16, SAMPLEFORMAT_UINT);
    u16.compression = compression;
    u16.predictor = compression == COMPRESSION_PACKBITS ? PREDICTOR_NONE : PREDICTOR_HORIZONTAL;
    ExpectSamplesAsWritten(dir / ("c" + std::to_string(n) + ".tif"), {u16}, ElementType::kUInt16, n % 2 == 0);
    ++n;
    Layout f32 = Bands(3, 32, SAMPLEFORMAT_IEEEFP);
    f32.compression = compression;
    f32.tiled = true;
    f32.predictor = compression == COMPRESSION_PACKBITS ? PREDICTOR_NONE : PREDICTOR_FLOATINGPOINT;
    // Little-endian: libtiff 4.5's writer byte-swaps big-endian samples before
    // the floating-point predictor's byte planes, which are the value's from
    // its most significant byte whatever the file's order (Adobe's Technical
    // Note 3; libtiff's reader and tifffile read them so), so its
    // big-endian files of this kind hold other values than it was given.
    ExpectSamplesAsWritten(dir / ("c" + std::to_string(n) + ".tif"), {f32}, ElementType::kFloat32);
    ++n;
  }
  EXPECT_GE(n, 6);  // LZW, Deflate and PackBits are in every libtiff
}

TEST(TiffArray, PagesStackOverviewsAreSkippedAndColourIsNotInterpreted) {
  TempDir dir;
  Layout page = Bands(2, 16, SAMPLEFORMAT_INT);
  ExpectSamplesAsWritten(dir / "stack.tif", {page, page, page}, ElementType::kInt16);

  // A full-resolution page and its overview: the page alone.
  Layout overview = page;
  overview.width = 18;
  overview.height = 14;
  overview.subfile = FILETYPE_REDUCEDIMAGE;
  std::vector<std::vector<std::uint8_t>> written;
  const std::string file = WriteTiffPages(dir / "cog.tif", {page, overview}, written);
  HostTensor t;
  ASSERT_OK(DecodeTiffArray(Bytes(file), 0, &t));
  EXPECT_EQ(t.shape, (std::vector<std::int64_t>{29, 37, 2}));
  ASSERT_EQ(t.data.size(), written[0].size());
  EXPECT_EQ(std::memcmp(t.data.data(), written[0].data(), written[0].size()), 0);

  // Min-is-white is not inverted; RGB is three samples.
  Layout white = Bands(1, 8, SAMPLEFORMAT_UINT);
  white.photometric = PHOTOMETRIC_MINISWHITE;
  ExpectSamplesAsWritten(dir / "white.tif", {white}, ElementType::kUInt8);
  Layout rgb;
  ExpectSamplesAsWritten(dir / "rgb.tif", {rgb}, ElementType::kUInt8);
}

TEST(TiffArray, PagesThatDifferAreRefusedNamingThePage) {
  TempDir dir;
  Layout a = Bands(3, 16, SAMPLEFORMAT_UINT), b = a;
  b.width = 20;
  std::vector<std::vector<std::uint8_t>> written;
  const std::string file = WriteTiffPages(dir / "differ.tif", {a, a, b}, written);
  HostTensor t;
  Status st = DecodeTiffArray(Bytes(file), 0, &t);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("page 2 (20x29, 3 uint16 samples a pixel) differs from the first (37x29"),
            std::string::npos)
      << st.message();
}

TEST(TiffArray, WhatIsNotLoadedIsRefusedByName) {
  TempDir dir;
  Layout bilevel = Bands(1, 1, SAMPLEFORMAT_UINT);
  Layout twelve = Bands(1, 12, SAMPLEFORMAT_UINT);
  Layout complex_float = Bands(1, 64, SAMPLEFORMAT_COMPLEXIEEEFP);
  Layout void_samples = Bands(1, 16, SAMPLEFORMAT_VOID);
  const std::pair<Layout, std::string> cases[] = {{bilevel, "1-bit samples (stoker.Image unpacks"},
                                                  {twelve, "12-bit unsigned samples"},
                                                  {complex_float, "64-bit complex floating-point samples"},
                                                  {void_samples, "16-bit untyped (void) samples"}};
  int n = 0;
  for (const auto& [layout, says] : cases) {
    std::vector<std::vector<std::uint8_t>> written;
    const std::string file = WriteTiffPages(dir / ("r" + std::to_string(n++) + ".tif"), {layout}, written);
    HostTensor t;
    Status st = DecodeTiffArray(Bytes(file), 0, &t);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.message();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
  }
}

TEST(TiffArray, BombsAndDamageAreCorruption) {
  TempDir dir;
  Layout l = Bands(2, 16, SAMPLEFORMAT_UINT);
  l.compression = COMPRESSION_LZW;
  std::vector<std::vector<std::uint8_t>> written;
  const std::string file = WriteTiffPages(dir / "ok.tif", {l, l}, written);
  HostTensor t;
  ASSERT_OK(DecodeTiffArray(Bytes(file), 2 * 37 * 29, &t));  // two pages of 2 x 2 bytes: exactly 4 bytes a pixel
  for (std::uint64_t limit : {std::uint64_t{2 * 37 * 29 - 1}, std::uint64_t{37 * 29}}) {
    Status bomb = DecodeTiffArray(Bytes(file), limit, &t);
    EXPECT_EQ(bomb.code(), StatusCode::kCorruption) << limit;
    EXPECT_NE(bomb.message().find("decompression bomb"), std::string::npos) << bomb.message();
  }
  Layout wide = Bands(5, 16, SAMPLEFORMAT_UINT);  // 10 bytes a pixel: over 4 x the pixel limit
  const std::string many_bands = WriteTiffPages(dir / "wide.tif", {wide}, written);
  EXPECT_EQ(DecodeTiffArray(Bytes(many_bands), 2 * 37 * 29, &t).code(), StatusCode::kCorruption);
  for (std::size_t keep : {std::size_t{6}, std::size_t{40}, file.size() / 2, file.size() - 20}) {
    Status st = DecodeTiffArray(Bytes(file.substr(0, keep)), 0, &t);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << keep << ": " << st.message();
    EXPECT_NE(st.message().find("TIFF"), std::string::npos) << st.message();
  }
}

TEST(TiffArray, AnArrayFieldTellsTiffFromNpy) {
  TempDir dir;
  std::vector<std::vector<std::uint8_t>> written;
  const std::string file = WriteTiffPages(dir / "a.tif", {Bands(2, 32, SAMPLEFORMAT_IEEEFP)}, written);
  HostTensor t;
  ASSERT_OK(DecodeArrayTensor(Bytes(file), 0, &t));
  EXPECT_EQ(t.type, ElementType::kFloat32);
  Status npy = DecodeArrayTensor(Bytes(std::string("\x93NUMPY garbage")), 0, &t);
  EXPECT_EQ(npy.code(), StatusCode::kCorruption);
  EXPECT_EQ(npy.message().find("TIFF"), std::string::npos) << npy.message();
}

}  // namespace
}  // namespace stoker::codec
