// The fast Huffman decoder (src/codec/jpeg_huffman.h) against libjpeg's own:
// every JPEG of a dataset decoded whole with each, the pixels compared, and
// the time of each (best of 3 a JPEG, the two alternating).
//
//   stoker_jpeg_entropy_bench DATASET [--images N] [--crop | --entropy-only]
//
// --crop decodes the centre half of each image (rows above skipped, columns
// cropped) instead of the whole; --entropy-only times only the Huffman
// decoding of every MCU, through libjpeg's decoder interface, no pixels.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codec/jpeg_huffman.h"
#include "entropy_time.h"
#include "jpeg_dataset.h"
#include "stoker/dataset.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: stoker_jpeg_entropy_bench DATASET [--images N] [--crop]\n");
    return 1;
  }
  std::uint64_t limit = 1000;
  bool crop = false, entropy_only = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--images" && i + 1 < argc)
      limit = std::stoull(argv[++i]);
    else if (a == "--crop")
      crop = true;
    else if (a == "--entropy-only")
      entropy_only = true;
  }
  auto opened = stoker_bench::OpenJpegDataset(argv[1]);
  if (!opened) return 1;
  stoker::Dataset* dataset = opened->dataset.get();
  const std::size_t field = opened->field;
  using stoker::codec::DecodedRegion;
  using stoker::codec::jpeg_internal::DecodeJpegUsing;
  double fast_s = 0, libjpeg_s = 0;
  std::uint64_t images = 0, differ = 0, failed = 0;
  DecodedRegion a, b;
  for (std::uint64_t i = 0; i < std::min(limit, dataset->num_samples()); ++i) {
    auto bytes = dataset->ReadField(i, field);
    if (!bytes.ok()) continue;
    stoker::codec::Roi roi;
    if (crop) {
      auto size = stoker::codec::JpegSize(*bytes);
      if (!size.ok()) continue;
      roi = {size->width / 4, size->height / 4, std::max(1, size->width / 2), std::max(1, size->height / 2)};
    }
    double best[2] = {1e9, 1e9};
    bool ok = true;
    if (entropy_only) {
      for (int r = 0; r < 3; ++r)
        for (int which = 0; which < 2; ++which) {
          const double e = stoker_bench::EntropySeconds(*bytes, which == 0);
          ok &= e >= 0;
          best[which] = std::min(best[which], e);
        }
      if (!ok) {
        ++failed;
        continue;
      }
      ++images;
      fast_s += best[0];
      libjpeg_s += best[1];
      continue;
    }
    for (int r = 0; r < 3; ++r)
      for (int which = 0; which < 2; ++which) {
        const auto t0 = std::chrono::steady_clock::now();
        ok &= DecodeJpegUsing(*bytes, roi, 1, which == 0 ? a : b, which == 0).ok();
        best[which] =
            std::min(best[which], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    if (!ok) {
      ++failed;
      continue;
    }
    ++images;
    differ += a.pixels != b.pixels || a.width != b.width || a.height != b.height;
    fast_s += best[0];
    libjpeg_s += best[1];
  }
  if (entropy_only)
    fmt::print(
        "{} JPEGs entropy-decoded (every MCU, no pixels) by both ({} failed): libjpeg's Huffman decoder "
        "{:.3f} ms a JPEG, the fast one {:.3f} ms ({:.1f}% less)\n",
        images, failed, 1e3 * libjpeg_s / images, 1e3 * fast_s / images, 100.0 * (1 - fast_s / libjpeg_s));
  else
    fmt::print(
        "{} JPEGs decoded {} by both ({} failed): {} differ; with libjpeg's Huffman decoder {:.3f} ms a JPEG, "
        "with the fast one {:.3f} ms ({:.1f}% less)\n",
        images, crop ? "(the centre half)" : "whole", failed, differ, 1e3 * libjpeg_s / images, 1e3 * fast_s / images,
        100.0 * (1 - fast_s / libjpeg_s));
  return differ == 0 ? 0 : 2;
}
