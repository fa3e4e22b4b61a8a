// Times opening the index of a 10-million-sample dataset, cold (page cache
// evicted) and warm, and the first record read after opening.
//
//   stoker_index_bench [--samples N] [--path FILE] [--repeat N]
//
// The index is synthetic (two fields, 640 samples per shard, like ~100 KB
// JPEGs in 64 MiB shards) and is built once at FILE, then reused.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/unique_fd.h"
#include "format/index_format.h"
#include "stoker/dataset.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) {
  fmt::print(stderr, "stoker_index_bench: {}\n", message);
  std::exit(1);
}

void Build(const std::string& path, std::uint64_t samples) {
  constexpr std::uint64_t kPerShard = 640;
  stoker::index_format::IndexBuilder builder;
  std::uint32_t shard = 0;
  std::uint64_t offset = 0;
  for (std::uint64_t i = 0; i < samples; ++i) {
    if (i % kPerShard == 0) {
      if (i > 0) builder.SetShardContents(shard, offset + 1024, i);
      shard = builder.AddShard(fmt::format("shard-{:06}.tar", i / kPerShard));
      offset = 0;
    }
    std::string key = fmt::format("n{:08}/{:08}", i % 1000, i);
    std::vector<stoker::index_format::IndexBuilder::Field> fields = {{"cls", offset + 512, 3},
                                                                     {"jpg", offset + 1536, 100'000}};
    offset += 1536 + 100'352;
    if (!builder.AddSample(shard, key, static_cast<std::int64_t>(i % 1000), i * 2654435761u, fields).ok()) Die("add");
  }
  builder.SetShardContents(shard, offset + 1024, samples);
  auto bytes = builder.Finish();
  if (!bytes.ok()) Die(bytes.error().ToString());
  auto status = stoker::WriteWholeFileAtomically(*stoker::FileSystem::Default(), path, *bytes);
  if (!status.ok()) Die(status.ToString());
}

void Evict(const std::string& path) {
  stoker::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid() || ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED) != 0) Die("evict " + path);
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t samples = 10'000'000;
  std::string path = "build/bench-data/index-10M.stoker";
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--samples" && i + 1 < argc)
      samples = std::stoull(argv[++i]);
    else if (a == "--path" && i + 1 < argc)
      path = argv[++i];
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else
      Die("usage: stoker_index_bench [--samples N] [--path FILE] [--repeat N]");
  }
  auto existing = stoker::Dataset::Open(path);
  if (!existing.ok() || (*existing)->num_samples() != samples) {
    existing = {stoker::Status::NotFound("rebuild")};
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    fmt::print(stderr, "building a synthetic {}-sample index at {} ...\n", samples, path);
    auto start = Clock::now();
    Build(path, samples);
    fmt::print(stderr, "built in {:.1f} s\n", std::chrono::duration<double>(Clock::now() - start).count());
  }
  fmt::print("index: {} samples, {:.1f} MB on disk\n", samples,
             static_cast<double>(std::filesystem::file_size(path)) / 1e6);
  for (bool cold : {true, false}) {
    std::vector<double> open_ms, first_ms;
    for (int r = 0; r < repeat; ++r) {
      if (cold) Evict(path);
      auto start = Clock::now();
      auto dataset = stoker::Dataset::Open(path);
      auto opened = Clock::now();
      if (!dataset.ok()) Die(dataset.error().ToString());
      auto sample = (*dataset)->Sample(samples / 2 + static_cast<std::uint64_t>(r));
      auto read = Clock::now();
      if (!sample.ok()) Die(sample.error().ToString());
      open_ms.push_back(std::chrono::duration<double, std::milli>(opened - start).count());
      first_ms.push_back(std::chrono::duration<double, std::milli>(read - opened).count());
    }
    std::sort(open_ms.begin(), open_ms.end());
    std::sort(first_ms.begin(), first_ms.end());
    fmt::print("{} cache: open median {:.2f} ms (max {:.2f} ms); then one record {:.3f} ms\n", cold ? "cold" : "warm",
               open_ms[open_ms.size() / 2], open_ms.back(), first_ms[first_ms.size() / 2]);
  }
  return 0;
}
