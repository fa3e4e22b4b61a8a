// A DatasetWriter's time and peak memory at tens of millions of small
// samples (a key and a `cls` each): what the writer itself holds per
// sample, the duplicate-key check and the index builder's records and keys.
//
//   stoker_writer_memory_bench OUT SAMPLES
#include <sys/resource.h>

#include <chrono>
#include <cstdlib>
#include <span>
#include <string>

#include <fmt/format.h>

#include "stoker/dataset_writer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fmt::print(stderr, "usage: stoker_writer_memory_bench OUT SAMPLES\n");
    return 1;
  }
  const long samples = std::atol(argv[2]);
  stoker::DatasetWriterOptions options;
  options.overwrite = true;
  auto writer = stoker::DatasetWriter::Create(argv[1], options);
  if (!writer.ok()) {
    fmt::print(stderr, "{}\n", writer.error().ToString());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  std::string cls;
  for (long i = 0; i < samples; ++i) {
    const std::string key = fmt::format("part{:03d}/{:09d}", i % 1000, i);
    cls = std::to_string(i % 1000);
    const stoker::SampleField fields[] = {{"cls", std::as_bytes(std::span(cls.data(), cls.size()))}};
    if (auto s = (*writer)->Add(key, fields); !s.ok()) {
      fmt::print(stderr, "{}\n", s.ToString());
      return 1;
    }
  }
  if (auto summary = (*writer)->Finish(); !summary.ok()) {
    fmt::print(stderr, "{}\n", summary.error().ToString());
    return 1;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  fmt::print("{} samples in {:.1f} s, peak RSS {:.0f} MiB\n", samples, seconds, usage.ru_maxrss / 1024.0);
  return 0;
}
