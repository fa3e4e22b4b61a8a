// The loader's ceiling: decode + crop + resize + normalise of in-memory JPEGs
// on one thread, with no I/O and no threading, times the cores the loader
// uses. The loader's images/s divided by this is its efficiency.
//
//   stoker_decode_bench DATASET [--threads-for-ceiling N] [--images N] [--eval] [--split]
//
// --split also times libjpeg's entropy (Huffman) decoding alone over each
// whole image (jpeg_read_coefficients: no IDCT, no colour conversion) and
// estimates, from each sample's crop, the share of stoker's decode that is
// entropy decoding (today: every MCU row down to the crop's last row) and
// what decoding only the crop's rows would save (issue 32: restart
// markers). The estimate assumes entropy-coded bytes spread evenly over
// the image's rows.
#include <algorithm>
#include <chrono>
#include <csetjmp>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "pipeline/image_pipeline.h"
#include "stoker/dataset.h"

namespace {

struct JumpError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
};

// Seconds to entropy-decode the whole of `jpeg` (jpeg_read_coefficients), or -1 when it does not decode.
double EntropyDecodeSeconds(const std::vector<std::byte>& jpeg) {
  jpeg_decompress_struct cinfo{};
  JumpError error{};
  cinfo.err = jpeg_std_error(&error.mgr);
  error.mgr.error_exit = [](j_common_ptr c) { std::longjmp(reinterpret_cast<JumpError*>(c->err)->jump, 1); };
  error.mgr.output_message = [](j_common_ptr) {};
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return -1;
  }
  jpeg_create_decompress(&cinfo);
  const auto start = std::chrono::steady_clock::now();
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(jpeg.data()), jpeg.size());
  jpeg_read_header(&cinfo, TRUE);
  (void)jpeg_read_coefficients(&cinfo);
  jpeg_finish_decompress(&cinfo);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  jpeg_destroy_decompress(&cinfo);
  return seconds;
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
  auto dataset = stoker::Dataset::Open(path);
  if (!dataset.ok()) {
    fmt::print(stderr, "{}\n", dataset.error().ToString());
    return 1;
  }
  auto field = (*dataset)->FieldIndex("jpg");
  if (!field) field = (*dataset)->FieldIndex("jpeg");
  if (!field) {
    fmt::print(stderr, "no jpg/jpeg field\n");
    return 1;
  }
  std::vector<std::vector<std::byte>> jpegs;
  // A seekable pack's restart tables (pack --seekable-jpeg), used as the loader uses them.
  std::vector<std::span<const std::byte>> tables;
  for (std::uint64_t i = 0; i < std::min(limit, (*dataset)->num_samples()); ++i) {
    auto bytes = (*dataset)->ReadField(i, *field);
    if (!bytes.ok()) continue;
    jpegs.push_back(std::move(bytes).value());
    tables.push_back((*dataset)->RestartTable(i, *field));
  }
  std::uint64_t seekable_used = 0;
  auto set_table = [&](stoker::ImageScratch& s, std::size_t i) {
    s.restarts = {tables[i].data(), static_cast<std::uint32_t>(tables[i].size() / 4)};
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
  if ((*dataset)->seekable_payloads() > 0)
    fmt::print("seekable pack: {} of {} crops decoded from only their restart intervals\n", seekable_used,
               jpegs.size());
  if (split) {
    // Entropy decoding alone, and each sample's crop rows (the same crops as above).
    double entropy_all = 0, entropy_to_crop_end = 0, entropy_in_crop = 0, entropy_in_box = 0;
    std::uint64_t counted = 0;
    for (std::size_t i = 0; i < jpegs.size(); ++i) {
      stoker::TransformTrace trace;
      scratch.restarts = {};
      if (!stoker::DecodeAndTransform(jpegs[i], t, writer, augmentation, 0, 0, i, out.data(), scratch, &trace, nullptr,
                                      nullptr)
               .ok())
        continue;
      double best = -1;
      for (int r = 0; r < 3; ++r) {  // best of 3: the machine's noise out
        const double e = EntropyDecodeSeconds(jpegs[i]);
        if (e >= 0 && (best < 0 || e < best)) best = e;
      }
      if (best < 0 || trace.source_height <= 0) continue;
      const double h = trace.source_height;
      entropy_all += best;
      entropy_to_crop_end += best * std::clamp(trace.y1 / h, 0.0, 1.0);
      entropy_in_crop += best * std::clamp((trace.y1 - trace.y0) / h, 0.0, 1.0);
      entropy_in_box += best * std::clamp((trace.y1 - trace.y0) / h, 0.0, 1.0) *
                        std::clamp((trace.x1 - trace.x0) / std::max(1, trace.source_width), 0.0, 1.0);
      ++counted;
    }
    const double n = static_cast<double>(std::max<std::uint64_t>(counted, 1));
    const double decode_ms = static_cast<double>(decode_ns.load()) / 1e6 / static_cast<double>(jpegs.size());
    fmt::print(
        "entropy decoding ({} images, best of 3 each): whole image {:.2f} ms; down to the crop's last row (what "
        "stoker's decode does today, estimated) {:.2f} ms = {:.0f}% of its {:.2f} ms decode; the crop's rows "
        "alone {:.2f} ms; decoding only those would save {:.2f} ms per image ({:.0f}% of decode + transform)\n",
        counted, 1e3 * entropy_all / n, 1e3 * entropy_to_crop_end / n, 100 * 1e3 * entropy_to_crop_end / n / decode_ms,
        decode_ms, 1e3 * entropy_in_crop / n, 1e3 * (entropy_to_crop_end - entropy_in_crop) / n,
        100 * 1e3 * (entropy_to_crop_end - entropy_in_crop) / n / (1000.0 / rate));
    fmt::print(
        "with restart intervals shorter than a row (columns skipped too): the crop's box alone {:.2f} ms, saving "
        "{:.2f} ms per image ({:.0f}% of decode + transform)\n",
        1e3 * entropy_in_box / n, 1e3 * (entropy_to_crop_end - entropy_in_box) / n,
        100 * 1e3 * (entropy_to_crop_end - entropy_in_box) / n / (1000.0 / rate));
  }
  return 0;
}
