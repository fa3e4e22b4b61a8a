// The loader's ceiling: decode + crop + resize + normalise of in-memory JPEGs
// on one thread, with no I/O and no threading, times the cores the loader
// uses. The loader's images/s divided by this is its efficiency.
//
//   stoker_decode_bench DATASET [--threads-for-ceiling N] [--images N] [--eval] [--split]
//
// --split times each phase on its own, per image: entropy (Huffman)
// decoding alone (every MCU through the decoder the loader uses, fast or
// libjpeg's: no IDCT, no colour conversion) of what the crop's decode reads (on a seekable pack, the
// stream of its intervals; otherwise every row down to the crop's last,
// estimated from the whole image's time with bytes taken as spread evenly
// over the rows), the rest of the decode (IDCT, upsampling, colour), the
// resample, and the flip + normalise + write.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "entropy_time.h"
#include "jpeg_dataset.h"
#include "pipeline/image_pipeline.h"
#include "stoker/dataset.h"

namespace {

// Seconds to entropy-decode the whole of `jpeg` with the Huffman decoder the
// loader uses (the fast one unless STOKER_JPEG_ENTROPY=libjpeg), or -1.
double EntropyDecodeSeconds(const std::vector<std::byte>& jpeg) {
  const bool fast = !stoker::codec::jpeg_internal::FastHuffmanDisabled();
  double s = stoker_bench::EntropySeconds(jpeg, fast);
  if (s < 0 && fast) s = stoker_bench::EntropySeconds(jpeg, false);  // what the loader falls back to
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: stoker_decode_bench DATASET [--threads-for-ceiling N] [--images N] [--eval]\n");
    return 1;
  }
  std::string path = argv[1];
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::uint64_t limit = 1000;
  bool eval = false, split = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads-for-ceiling" && i + 1 < argc)
      cores = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--images" && i + 1 < argc)
      limit = std::stoull(argv[++i]);
    else if (a == "--eval")
      eval = true;
    else if (a == "--split")
      split = true;
  }
  auto opened = stoker_bench::OpenJpegDataset(path);
  if (!opened) return 1;
  stoker::Dataset* dataset = opened->dataset.get();
  const std::size_t field = opened->field;
  std::vector<std::vector<std::byte>> jpegs;
  std::vector<std::uint64_t> sample_of;  // each JPEG's sample
  for (std::uint64_t i = 0; i < std::min(limit, dataset->num_samples()); ++i) {
    auto bytes = dataset->ReadField(i, field);
    if (!bytes.ok()) continue;
    jpegs.push_back(std::move(bytes).value());
    sample_of.push_back(i);
  }
  std::uint64_t seekable_used = 0;
  // A seekable pack's restart table (pack --seekable-jpeg), taken from the index per sample as the loader does.
  auto set_table = [&](stoker::ImageScratch& s, std::size_t i) {
    s.restarts = {};
    if (dataset->RestartTable(sample_of[i], field, s.restart_table))
      s.restarts = {reinterpret_cast<const std::byte*>(s.restart_table.data()),
                    static_cast<std::uint32_t>(s.restart_table.size())};
    s.seek_use.reset();
  };
  stoker::TransformOptions t;  // the ImageNet training transform, float32 NCHW
  if (eval) {
    t.kind = stoker::TransformOptions::Kind::kResizeCenterCrop;
    t.flip_probability = 0;
  }
  stoker::transform::OutputWriter writer(t.dtype, t.layout, t.normalize, t.mean, t.std);
  const stoker::transform::Augmentation augmentation;  // no steps: the plain ImageNet path
  std::vector<std::byte> out(static_cast<std::size_t>(t.width) * t.height * 3 * 4);
  stoker::ImageScratch scratch;
  std::atomic<std::uint64_t> decode_ns{0}, transform_ns{0};
  // One untimed pass to warm caches and scratch buffers.
  for (std::size_t i = 0; i < std::min<std::size_t>(jpegs.size(), 20); ++i) {
    set_table(scratch, i);
    (void)stoker::DecodeAndTransform(jpegs[i], t, writer, augmentation, 0, 0, i, out.data(), scratch, nullptr, nullptr,
                                     nullptr);
  }
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < jpegs.size(); ++i) {
    set_table(scratch, i);
    auto s = stoker::DecodeAndTransform(jpegs[i], t, writer, augmentation, 0, 0, i, out.data(), scratch, nullptr,
                                        &decode_ns, &transform_ns);
    if (!s.ok()) fmt::print(stderr, "sample {}: {}\n", i, s.ToString());
    seekable_used += scratch.seek_use == stoker::codec::SeekUse::kUsed;
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double rate = static_cast<double>(jpegs.size()) / wall;
  fmt::print(
      "{} images, {} transform, one thread, no I/O: {:.0f} images/s ({:.2f} ms each: decode {:.2f}, "
      "crop+resize+normalise {:.2f})\n",
      jpegs.size(), eval ? "eval" : "train", rate, 1000.0 / rate,
      static_cast<double>(decode_ns.load()) / 1e6 / static_cast<double>(jpegs.size()),
      static_cast<double>(transform_ns.load()) / 1e6 / static_cast<double>(jpegs.size()));
  fmt::print("ceiling for {} cores: {:.0f} images/s\n", cores, rate * cores);
  if (dataset->seekable_payloads() > 0)
    fmt::print("seekable pack: {} of {} crops decoded from only their restart intervals\n", seekable_used,
               jpegs.size());
  if (split) {
    // Where the time goes, per image: each phase timed on its own (best of
    // 3, the machine's noise out) over the same crops as above.
    double entropy = 0, decode = 0, resample = 0, entropy_whole = 0;
    std::uint64_t counted = 0, stream_bytes = 0, file_bytes = 0;
    auto best_of_3 = [](auto&& f) {
      double best = -1;
      for (int r = 0; r < 3; ++r) {
        const auto s0 = std::chrono::steady_clock::now();
        if (!f()) return -1.0;
        const double e = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
        if (best < 0 || e < best) best = e;
      }
      return best;
    };
    for (std::size_t i = 0; i < jpegs.size(); ++i) {
      stoker::DecodedCrop crop;
      const double d = best_of_3([&] {
        set_table(scratch, i);
        return stoker::DecodeCrop(jpegs[i], t, 0, 0, i, scratch, crop).ok();
      });
      if (d < 0) continue;
      const bool seeked = scratch.seek_use == stoker::codec::SeekUse::kUsed;
      const std::vector<std::byte> stream = seeked ? scratch.seek_stream : std::vector<std::byte>{};
      stream_bytes += seeked ? stream.size() : jpegs[i].size();
      file_bytes += jpegs[i].size();
      const double r = best_of_3([&] { return stoker::ResizeCrop(crop, t, scratch).ok(); });
      double whole = -1;
      for (int k = 0; k < 3; ++k) {
        const double e = EntropyDecodeSeconds(jpegs[i]);
        if (e >= 0 && (whole < 0 || e < whole)) whole = e;
      }
      double e = -1;
      if (seeked) {
        for (int k = 0; k < 3; ++k) {
          const double x = EntropyDecodeSeconds(stream);
          if (x >= 0 && (e < 0 || x < e)) e = x;
        }
      } else if (whole >= 0 && crop.trace.source_height > 0) {
        // libjpeg entropy-decodes every row down to the region's last:
        // estimated, bytes taken as spread evenly over the rows.
        e = whole * std::clamp((crop.trace.y1 + 4.0 * crop.trace.decode_scale) / crop.trace.source_height, 0.0, 1.0);
      }
      if (e < 0 || whole < 0) continue;
      decode += d;
      entropy += e;
      entropy_whole += whole;
      resample += r;
      ++counted;
    }
    const double n = static_cast<double>(std::max<std::uint64_t>(counted, 1));
    const double transform_ms = static_cast<double>(transform_ns.load()) / 1e6 / static_cast<double>(jpegs.size());
    fmt::print(
        "per image, {} images{}: entropy decoding {:.3f} ms{} (the whole image's: {:.3f}); IDCT, upsampling and "
        "colour {:.3f} ms; resample {:.3f} ms; flip, normalise and write {:.3f} ms (the main loop's transform time "
        "less resample)\n",
        counted, dataset->seekable_payloads() > 0 ? " (seekable pack)" : "", 1e3 * entropy / n,
        dataset->seekable_payloads() > 0
            ? " (of the intervals decoded; rows to the crop's end estimated where none were skipped)"
            : " (down to the crop's last row, estimated)",
        1e3 * entropy_whole / n, 1e3 * (decode - entropy) / n, 1e3 * resample / n,
        std::max(0.0, transform_ms - 1e3 * resample / n));
    if (dataset->seekable_payloads() > 0)
      fmt::print(
          "libjpeg was given {:.0f}% of the JPEGs' bytes (the intervals' streams; whole files where none "
          "were skipped)\n",
          100.0 * static_cast<double>(stream_bytes) / static_cast<double>(std::max<std::uint64_t>(file_bytes, 1)));
  }
  return 0;
}
