// TIFFs written with libtiff in any layout, for the image and array
// decoders' tests: pseudo-random samples, one directory a page.
#pragma once

#include <tiffio.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

namespace stoker::codec::tiff_testing {

struct Layout {
  int width = 37, height = 29, bits = 8, spp = 3;
  int photometric = PHOTOMETRIC_RGB;
  int planar = PLANARCONFIG_CONTIG;
  bool tiled = false;
  int format = SAMPLEFORMAT_UINT;
  int extra = -1;  // an extra sample's meaning, -1 for none
  int compression = COMPRESSION_NONE;
  int predictor = PREDICTOR_NONE;
  std::uint32_t subfile = 0;  // SUBFILETYPE: FILETYPE_REDUCEDIMAGE for an overview
};

// Writes one page a layout, each filled with pseudo-random samples (its own
// sequence), in big-endian byte order when `big_endian`; returns the
// file's bytes and, in `samples`, what each page holds: planes of rows of
// packed bits, in this machine's byte order.
inline std::string WriteTiffPages(const std::string& path, const std::vector<Layout>& pages,
                                  std::vector<std::vector<std::uint8_t>>& samples, bool big_endian = false) {
  TIFF* t = TIFFOpen(path.c_str(), big_endian ? "wb" : "wl");
  EXPECT_NE(t, nullptr);
  samples.assign(pages.size(), {});
  std::uint32_t seed = 1;
  for (std::size_t page = 0; page < pages.size(); ++page) {
    const Layout& l = pages[page];
    TIFFSetField(t, TIFFTAG_IMAGEWIDTH, l.width);
    TIFFSetField(t, TIFFTAG_IMAGELENGTH, l.height);
    TIFFSetField(t, TIFFTAG_BITSPERSAMPLE, l.bits);
    TIFFSetField(t, TIFFTAG_SAMPLESPERPIXEL, l.spp);
    TIFFSetField(t, TIFFTAG_PHOTOMETRIC, l.photometric);
    TIFFSetField(t, TIFFTAG_PLANARCONFIG, l.planar);
    TIFFSetField(t, TIFFTAG_SAMPLEFORMAT, l.format);
    TIFFSetField(t, TIFFTAG_COMPRESSION, l.compression);
    if (l.predictor != PREDICTOR_NONE) TIFFSetField(t, TIFFTAG_PREDICTOR, l.predictor);
    if (l.subfile != 0) TIFFSetField(t, TIFFTAG_SUBFILETYPE, l.subfile);
    if (l.extra >= 0) {
      const std::uint16_t extra = static_cast<std::uint16_t>(l.extra);
      TIFFSetField(t, TIFFTAG_EXTRASAMPLES, 1, &extra);
    } else if (l.spp > 1 && l.photometric == PHOTOMETRIC_MINISBLACK) {
      const std::vector<std::uint16_t> extra(static_cast<std::size_t>(l.spp - 1), EXTRASAMPLE_UNSPECIFIED);
      TIFFSetField(t, TIFFTAG_EXTRASAMPLES, l.spp - 1, extra.data());
    } else if (l.spp > 3 && l.photometric == PHOTOMETRIC_RGB) {
      const std::vector<std::uint16_t> extra(static_cast<std::size_t>(l.spp - 3), EXTRASAMPLE_UNSPECIFIED);
      TIFFSetField(t, TIFFTAG_EXTRASAMPLES, l.spp - 3, extra.data());
    }
    if (l.photometric == PHOTOMETRIC_SEPARATED) TIFFSetField(t, TIFFTAG_INKSET, INKSET_CMYK);
    const int planes = l.planar == PLANARCONFIG_SEPARATE ? l.spp : 1;
    const int per_plane = l.planar == PLANARCONFIG_SEPARATE ? 1 : l.spp;
    const std::size_t row = (std::size_t(l.width) * per_plane * l.bits + 7) / 8;
    std::vector<std::uint8_t>& s = samples[page];
    s.assign(row * l.height * planes, 0);
    for (auto& b : s) {
      seed = seed * 1103515245 + 12345;
      b = static_cast<std::uint8_t>(seed >> 16);
    }
    // libtiff byte-swaps (and predicts) what it writes in place: it is given copies.
    if (l.tiled) {
      TIFFSetField(t, TIFFTAG_TILEWIDTH, 16);
      TIFFSetField(t, TIFFTAG_TILELENGTH, 16);
      std::vector<std::uint8_t> tile(static_cast<std::size_t>(TIFFTileSize(t)));
      const std::size_t tile_row = static_cast<std::size_t>(TIFFTileRowSize(t));
      for (int p = 0; p < planes; ++p)
        for (int y = 0; y < l.height; y += 16)
          for (int x = 0; x < l.width; x += 16) {
            std::fill(tile.begin(), tile.end(), 0);
            const std::size_t start = std::size_t(x) * per_plane * l.bits / 8;
            for (int r = 0; r < 16 && y + r < l.height; ++r)
              std::memcpy(tile.data() + r * tile_row, s.data() + (std::size_t(p) * l.height + y + r) * row + start,
                          std::min(tile_row, row - start));
            EXPECT_GE(TIFFWriteEncodedTile(t, TIFFComputeTile(t, x, y, 0, p), tile.data(),
                                           static_cast<tmsize_t>(tile.size())),
                      0);
          }
    } else {
      TIFFSetField(t, TIFFTAG_ROWSPERSTRIP, 5);
      std::vector<std::uint8_t> copy(row);
      for (int p = 0; p < planes; ++p)
        for (int y = 0; y < l.height; ++y) {
          std::memcpy(copy.data(), s.data() + (std::size_t(p) * l.height + y) * row, row);
          EXPECT_EQ(TIFFWriteScanline(t, copy.data(), y, p), 1);
        }
    }
    EXPECT_EQ(TIFFWriteDirectory(t), 1);
  }
  TIFFClose(t);
  return testing::ReadFile(path);
}

// One page.
inline std::string WriteTiff(const std::string& path, const Layout& l, std::vector<std::uint8_t>& samples) {
  std::vector<std::vector<std::uint8_t>> pages;
  std::string file = WriteTiffPages(path, {l}, pages);
  samples = std::move(pages[0]);
  return file;
}

inline std::span<const std::byte> Bytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

}  // namespace stoker::codec::tiff_testing
