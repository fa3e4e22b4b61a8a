// JPEGs for the codec's tests, written with libjpeg's own encoder in any
// layout the decoders must handle: sampling, grey, progressive, arithmetic,
// restart intervals, metadata markers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "codec/jpeg_internal.h"
#include "core/rng.h"

namespace stoker::codec::testing_jpeg {

struct EncodeSpec {
  int width = 0, height = 0;
  int components = 3;
  int h = 2, v = 2;            // luma sampling (chroma 1x1)
  int grey_h = 1, grey_v = 1;  // a grey image's sampling: 1x1, or declared larger (still a block an MCU)
  bool progressive = false;
  bool arithmetic = false;
  bool optimize = false;
  int restart_interval = 0;  // in MCUs (libjpeg's own encoder, as `cjpeg -restart NB`)
  std::string app1;          // an APP1 (EXIF-like) payload to keep, when not empty
  std::string comment;       // a COM payload, when not empty
};

inline EncodeSpec Spec(int width, int height, int components = 3, int h = 2, int v = 2) {
  EncodeSpec s;
  s.width = width;
  s.height = height;
  s.components = components;
  s.h = h;
  s.v = v;
  return s;
}

// Pixels with edges and texture, so the entropy-coded data is not trivial.
inline std::vector<std::uint8_t> NoisyPixels(int width, int height, int components, std::uint64_t seed) {
  Rng rng(seed, 1);
  std::vector<std::uint8_t> p(static_cast<std::size_t>(width) * height * components);
  for (int y = 0; y < height; ++y)
    for (int x = 0; x < width; ++x)
      for (int c = 0; c < components; ++c) {
        const int smooth = (x * (c + 1) * 3 + y * (2 - c % 2) * 5) % 256;
        const int noise = static_cast<int>(rng.Next() % 40);
        p[(static_cast<std::size_t>(y) * width + x) * components + c] =
            static_cast<std::uint8_t>(((x / 37 + y / 29) % 2 ? smooth : 255 - smooth) / 2 + noise);
      }
  return p;
}

inline std::vector<std::byte> Encode(const EncodeSpec& s, std::uint64_t seed = 7) {
  const std::vector<std::uint8_t> pixels = NoisyPixels(s.width, s.height, s.components, seed);
  jpeg_internal::Compressor c;
  EXPECT_TRUE(c.created);
  if (setjmp(c.err.jump)) {
    ADD_FAILURE() << "encoding failed: " << c.err.message;
    return {};
  }
  jpeg_mem_dest(&c.cinfo, &c.buffer, &c.size);
  c.cinfo.image_width = static_cast<JDIMENSION>(s.width);
  c.cinfo.image_height = static_cast<JDIMENSION>(s.height);
  c.cinfo.input_components = s.components;
  c.cinfo.in_color_space = s.components == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&c.cinfo);
  jpeg_set_quality(&c.cinfo, 90, TRUE);
  if (s.components == 3) {
    c.cinfo.comp_info[0].h_samp_factor = s.h;
    c.cinfo.comp_info[0].v_samp_factor = s.v;
  }
  if (s.components == 1) {
    c.cinfo.comp_info[0].h_samp_factor = s.grey_h;
    c.cinfo.comp_info[0].v_samp_factor = s.grey_v;
  }
  if (s.progressive) jpeg_simple_progression(&c.cinfo);
  c.cinfo.arith_code = s.arithmetic ? TRUE : FALSE;
  c.cinfo.optimize_coding = s.optimize ? TRUE : FALSE;
  c.cinfo.restart_interval = static_cast<unsigned>(s.restart_interval);
  jpeg_start_compress(&c.cinfo, TRUE);
  if (!s.app1.empty())
    jpeg_write_marker(&c.cinfo, JPEG_APP0 + 1, reinterpret_cast<const JOCTET*>(s.app1.data()),
                      static_cast<unsigned>(s.app1.size()));
  if (!s.comment.empty())
    jpeg_write_marker(&c.cinfo, JPEG_COM, reinterpret_cast<const JOCTET*>(s.comment.data()),
                      static_cast<unsigned>(s.comment.size()));
  while (c.cinfo.next_scanline < c.cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(pixels.data() + std::size_t{c.cinfo.next_scanline} * s.width * s.components);
    jpeg_write_scanlines(&c.cinfo, &row, 1);
  }
  jpeg_finish_compress(&c.cinfo);
  const auto* begin = reinterpret_cast<const std::byte*>(c.buffer);
  return std::vector<std::byte>(begin, begin + c.size);
}

}  // namespace stoker::codec::testing_jpeg
