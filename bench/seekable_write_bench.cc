// What `stoker pack --seekable-jpeg` spends per image: the lossless rewrite
// with its check (MakeSeekableJpeg), and beside it the two whole decodes the
// check used to make, each timed alone (one thread, best of 3 per image).
//
//   stoker_seekable_bench DATASET [--images N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "codec/jpeg_huffman.h"
#include "codec/jpeg_restart.h"
#include "jpeg_dataset.h"
#include "stoker/dataset.h"

namespace {

template <typename F>
double BestSeconds(F&& f) {
  double best = 1e9;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: stoker_seekable_bench DATASET [--images N]\n");
    return 1;
  }
  std::uint64_t limit = 1000;
  for (int i = 2; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--images") limit = std::stoull(argv[++i]);
  auto opened = stoker_bench::OpenJpegDataset(argv[1]);
  if (!opened) return 1;
  stoker::Dataset* dataset = opened->dataset.get();
  using stoker::codec::DecodedRegion;
  double rewrite_s = 0, decode_libjpeg_s = 0, decode_fast_s = 0;
  std::uint64_t images = 0, rewritten = 0, bytes_in = 0;
  DecodedRegion region;
  for (std::uint64_t i = 0; i < std::min(limit, dataset->num_samples()); ++i) {
    auto bytes = dataset->ReadField(i, opened->field);
    if (!bytes.ok()) continue;
    stoker::codec::SeekableJpeg out;
    rewrite_s += BestSeconds([&] { out = stoker::codec::MakeSeekableJpeg(*bytes); });
    ++images;
    bytes_in += bytes->size();
    if (out.outcome != stoker::codec::SeekableOutcome::kRewritten) continue;
    ++rewritten;
    decode_libjpeg_s += BestSeconds(
        [&] { (void)stoker::codec::jpeg_internal::DecodeJpegUsing(*bytes, {}, 1, region, /*fast_huffman=*/false); });
    decode_fast_s += BestSeconds([&] { (void)stoker::codec::DecodeJpeg(out.bytes, {}, 1, region); });
  }
  if (images == 0) return 1;
  fmt::print("{} images ({:.1f} KB on average), {} rewritten\n", images, bytes_in / 1e3 / images, rewritten);
  fmt::print("MakeSeekableJpeg:              {:.3f} ms an image ({:.0f} images/s a core)\n", rewrite_s * 1e3 / images,
             images / rewrite_s);
  if (rewritten > 0) {
    fmt::print("a whole decode, libjpeg:       {:.3f} ms\n", decode_libjpeg_s * 1e3 / rewritten);
    fmt::print("a whole decode, fast Huffman:  {:.3f} ms\n", decode_fast_s * 1e3 / rewritten);
  }
  return 0;
}
