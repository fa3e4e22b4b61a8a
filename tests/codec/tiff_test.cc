// TIFF decoding: files written here with libtiff in the layouts Pillow's
// writer does not make (tiles, planes, 16-bit colour, min-is-white, 2- and
// 4-bit gray) decode to the samples written, converted as Pillow opens them
// (checked against Pillow 9.4 when this was written; tests/python/
// test_decode.py compares Pillow's own TIFFs pixel for pixel); what stoker
// does not decode is refused by name; damage is Corruption.
#include "codec/tiff.h"

#include <tiffio.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/image_decode.h"
#include "codec/tiff_test_util.h"
#include "test_util.h"

namespace stoker::codec {
namespace {

using testing::TempDir;
using tiff_testing::Bytes;
using tiff_testing::Layout;
using tiff_testing::WriteTiff;

// The sample (8 or 16 bits) of pixel (x, y), channel c, as written.
std::uint32_t Written(const Layout& l, const std::vector<std::uint8_t>& s, int x, int y, int c) {
  const bool separate = l.planar == PLANARCONFIG_SEPARATE;
  const std::size_t per_plane = separate ? 1 : l.spp;
  const std::size_t row = (std::size_t(l.width) * per_plane * l.bits + 7) / 8;
  const std::size_t plane = separate ? c : 0, index = x * per_plane + (separate ? 0 : c);
  const std::uint8_t* r = s.data() + (plane * l.height + y) * row;
  if (l.bits == 16) {
    std::uint16_t v;
    std::memcpy(&v, r + 2 * index, 2);
    return v;
  }
  if (l.bits == 8) return r[index];
  const std::size_t bit = index * l.bits;
  return (r[bit / 8] >> (8 - l.bits - bit % 8)) & ((1u << l.bits) - 1);
}

TEST(Tiff, TilesPlanesAndCompressionsDecodeToTheSamplesWritten) {
  TempDir dir;
  Layout tiled, planar, planar_tiled_rgba, lzw_tiled, zstd, deflate_planar;
  tiled.tiled = true;
  planar.planar = PLANARCONFIG_SEPARATE;
  planar_tiled_rgba.planar = PLANARCONFIG_SEPARATE;
  planar_tiled_rgba.tiled = true;
  planar_tiled_rgba.spp = 4;
  planar_tiled_rgba.extra = EXTRASAMPLE_UNASSALPHA;
  lzw_tiled.tiled = true;
  lzw_tiled.compression = COMPRESSION_LZW;
  zstd.compression = COMPRESSION_ZSTD;
  deflate_planar.planar = PLANARCONFIG_SEPARATE;
  deflate_planar.compression = COMPRESSION_ADOBE_DEFLATE;
  int i = 0;
  for (const Layout& l : {tiled, planar, planar_tiled_rgba, lzw_tiled, zstd, deflate_planar}) {
    std::vector<std::uint8_t> samples;
    const std::string file = WriteTiff(dir / ("l" + std::to_string(i++) + ".tif"), l, samples);
    SourceImage image;
    ASSERT_OK(DecodeTiff(Bytes(file), 0, &image));
    ASSERT_EQ(image.mode, l.spp == 4 ? SourceMode::kRGBA : SourceMode::kRGB);
    ASSERT_EQ(image.width, l.width);
    ASSERT_EQ(image.height, l.height);
    for (int y = 0; y < l.height; ++y)
      for (int x = 0; x < l.width; ++x)
        for (int c = 0; c < l.spp; ++c)
          ASSERT_EQ(image.data[(std::size_t(y) * l.width + x) * l.spp + c], Written(l, samples, x, y, c))
              << "layout " << i - 1 << " at " << x << "," << y << "," << c;
  }
}

TEST(Tiff, DepthsAndMinIsWhiteAreOpenedAsPillowOpensThem) {
  TempDir dir;
  auto decode = [&](const Layout& l, std::vector<std::uint8_t>& samples, SourceImage& image) {
    static int n = 0;
    const std::string file = WriteTiff(dir / ("d" + std::to_string(n++) + ".tif"), l, samples);
    ASSERT_OK(DecodeTiff(Bytes(file), 0, &image));
  };
  std::vector<std::uint8_t> s;
  SourceImage image;
  Layout rgb16;  // "RGB;16": each sample's high byte
  rgb16.bits = 16;
  decode(rgb16, s, image);
  ASSERT_EQ(image.mode, SourceMode::kRGB);
  EXPECT_EQ(image.data[5], Written(rgb16, s, 1, 0, 2) >> 8);
  Layout gray16;  // "I;16": kept whole, min-is-white too (Pillow does not invert it)
  gray16.bits = 16;
  gray16.spp = 1;
  gray16.photometric = PHOTOMETRIC_MINISWHITE;
  gray16.tiled = true;
  decode(gray16, s, image);
  ASSERT_EQ(image.mode, SourceMode::kGray16);
  std::uint16_t v;
  std::memcpy(&v, image.data.data() + 2 * (3 * 37 + 20), 2);
  EXPECT_EQ(v, Written(gray16, s, 20, 3, 0));
  Layout white8;  // "L;I": inverted
  white8.spp = 1;
  white8.photometric = PHOTOMETRIC_MINISWHITE;
  decode(white8, s, image);
  ASSERT_EQ(image.mode, SourceMode::kGray);
  EXPECT_EQ(image.data[4 * 37 + 7], 255 - Written(white8, s, 7, 4, 0));
  for (int bits : {1, 2, 4}) {  // scaled to 0..255; 1-bit min-is-white inverted
    for (bool tiles : {false, true}) {
      Layout low;
      low.spp = 1;
      low.bits = bits;
      low.tiled = tiles;
      low.photometric = bits == 1 ? PHOTOMETRIC_MINISWHITE : PHOTOMETRIC_MINISBLACK;
      decode(low, s, image);
      ASSERT_EQ(image.mode, SourceMode::kGray);
      const std::uint32_t top = (1u << bits) - 1;
      for (int y = 0; y < low.height; ++y)
        for (int x = 0; x < low.width; ++x) {
          std::uint32_t level = Written(low, s, x, y, 0);
          if (bits == 1) level = top - level;
          ASSERT_EQ(image.data[std::size_t(y) * low.width + x], level * 255 / top)
              << bits << "-bit at " << x << "," << y;
        }
    }
  }
  Layout la;  // gray + alpha, planar
  la.spp = 2;
  la.photometric = PHOTOMETRIC_MINISBLACK;
  la.planar = PLANARCONFIG_SEPARATE;
  la.extra = EXTRASAMPLE_UNASSALPHA;
  decode(la, s, image);
  ASSERT_EQ(image.mode, SourceMode::kGrayAlpha);
  EXPECT_EQ(image.data[2 * (2 * 37 + 9) + 1], Written(la, s, 9, 2, 1));
}

TEST(Tiff, WhatStokerDoesNotDecodeIsRefusedByName) {
  TempDir dir;
  std::vector<std::uint8_t> s;
  SourceImage image;
  Layout f;
  f.spp = 1;
  f.bits = 32;
  f.photometric = PHOTOMETRIC_MINISBLACK;
  f.format = SAMPLEFORMAT_IEEEFP;
  Layout cmyk;
  cmyk.spp = 4;
  cmyk.photometric = PHOTOMETRIC_SEPARATED;
  Layout premultiplied;
  premultiplied.spp = 4;
  premultiplied.extra = EXTRASAMPLE_ASSOCALPHA;
  Layout signed16;
  signed16.spp = 1;
  signed16.bits = 16;
  signed16.photometric = PHOTOMETRIC_MINISBLACK;
  signed16.format = SAMPLEFORMAT_INT;
  Layout many;  // the fuzzer's: a header of 7+ samples a pixel made a 1 Mpx image ask for gigabytes
  many.spp = 7;
  const std::pair<Layout, std::string> cases[] = {{f, "32-bit floating-point samples"},
                                                  {cmyk, "CMYK"},
                                                  {premultiplied, "associated (premultiplied) alpha"},
                                                  {signed16, "16-bit signed samples"},
                                                  {many, "7 samples a pixel"}};
  int n = 0;
  for (const auto& [layout, says] : cases) {
    const std::string file = WriteTiff(dir / ("r" + std::to_string(n++) + ".tif"), layout, s);
    Status st = DecodeTiff(Bytes(file), 0, &image);
    EXPECT_EQ(st.code(), StatusCode::kUnimplemented) << st.message();
    EXPECT_NE(st.message().find(says), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("stoker.Array"), std::string::npos) << st.message();
  }
}

TEST(Tiff, DamageAndBombsAreCorruptionThroughTheImageDecoder) {
  TempDir dir;
  std::vector<std::uint8_t> s;
  Layout l;
  l.compression = COMPRESSION_LZW;
  const std::string file = WriteTiff(dir / "ok.tif", l, s);
  ASSERT_EQ(DetectImageFormat(Bytes(file)), ImageFormat::kTiff);
  ASSERT_OK_AND_ASSIGN(ImageSize size, ImageFileSize(Bytes(file)));
  EXPECT_EQ(size.width, 37);
  EXPECT_EQ(size.height, 29);
  SourceImage image;
  Status bomb = DecodeImageFile(Bytes(file), 37 * 29 - 1, &image);
  EXPECT_EQ(bomb.code(), StatusCode::kCorruption);
  EXPECT_NE(bomb.message().find("decompression bomb"), std::string::npos) << bomb.message();
  for (std::size_t keep : {std::size_t{6}, std::size_t{40}, file.size() / 2, file.size() - 20}) {
    Status st = DecodeImageFile(Bytes(file.substr(0, keep)), 0, &image);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << keep << ": " << st.message();
    EXPECT_NE(st.message().find("TIFF"), std::string::npos) << st.message();
  }
  std::string flipped = file;
  for (std::size_t i = 300; i < 340 && i < flipped.size(); ++i) flipped[i] = static_cast<char>(~flipped[i]);
  Status st = DecodeImageFile(Bytes(flipped), 0, &image);  // damaged LZW data: an error or other pixels, no crash
  if (!st.ok()) {
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << st.message();
  }
}

}  // namespace
}  // namespace stoker::codec
