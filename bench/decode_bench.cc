// The loader's ceiling: decode + crop + resize + normalise of in-memory JPEGs
// on one thread, with no I/O and no threading, times the cores the loader
// uses. The loader's images/s divided by this is its efficiency.
//
//   stoker_decode_bench DATASET [--threads-for-ceiling N] [--images N] [--eval]
#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "pipeline/image_pipeline.h"
#include "stoker/dataset.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    fmt::print(stderr, "usage: stoker_decode_bench DATASET [--threads-for-ceiling N] [--images N] [--eval]\n");
    return 1;
  }
  std::string path = argv[1];
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::uint64_t limit = 1000;
  bool eval = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--threads-for-ceiling" && i + 1 < argc)
      cores = static_cast<unsigned>(std::stoul(argv[++i]));
    else if (a == "--images" && i + 1 < argc)
      limit = std::stoull(argv[++i]);
    else if (a == "--eval")
      eval = true;
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
  for (std::uint64_t i = 0; i < std::min(limit, (*dataset)->num_samples()); ++i) {
    auto bytes = (*dataset)->ReadField(i, *field);
    if (bytes.ok()) jpegs.push_back(std::move(bytes).value());
  }
  stoker::TransformOptions t;  // the ImageNet training transform, float32 NCHW
  if (eval) {
    t.kind = stoker::TransformOptions::Kind::kResizeCenterCrop;
    t.flip_probability = 0;
  }
  stoker::transform::OutputWriter writer(t.dtype, t.layout, t.normalize, t.mean, t.std);
  std::vector<std::byte> out(static_cast<std::size_t>(t.width) * t.height * 3 * 4);
  stoker::ImageScratch scratch;
  std::atomic<std::uint64_t> decode_ns{0}, transform_ns{0};
  // One untimed pass to warm caches and scratch buffers.
  for (std::size_t i = 0; i < std::min<std::size_t>(jpegs.size(), 20); ++i)
    (void)stoker::DecodeAndTransform(jpegs[i], t, writer, 0, 0, i, out.data(), scratch, nullptr, nullptr, nullptr);
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < jpegs.size(); ++i) {
    auto s = stoker::DecodeAndTransform(jpegs[i], t, writer, 0, 0, i, out.data(), scratch, nullptr, &decode_ns,
                                        &transform_ns);
    if (!s.ok()) fmt::print(stderr, "sample {}: {}\n", i, s.ToString());
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
  return 0;
}
