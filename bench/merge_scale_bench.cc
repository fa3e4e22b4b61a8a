// Times `stoker merge` (MergeDatasets) over synthetic part indexes and
// reports each merge's peak resident memory: how merging scales to datasets
// of tens of millions of samples (LAION-size collections are packed by many
// workers and merged). A merge reads indexes only, so the parts here are
// indexes alone, built once under WORK (their shards do not exist).
//
//   stoker_merge_bench [--parts P] [--samples N] [--seekable] [--work DIR] [--repeat R]
//
// Each sample has a label, a 100 KB "jpg" and a short "txt", 640 samples a
// shard, keys like ImageNet's ("n00000123/00001234"). With --seekable each
// jpg has a restart table and region record as a 500x375 seekable JPEG has
// (24 MCU rows of 16 intervals). Each merge runs in a child process of its
// own, so its peak RSS (wait4) is the merge's alone; its anonymous memory
// (RssAnon, sampled every 2 ms) is shown beside it, since the mapped part
// indexes count in RSS as page cache.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "format/index_format.h"
#include "stoker/file_system.h"
#include "stoker/merge.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace index_format = stoker::index_format;

[[noreturn]] void Die(const std::string& message) {
  fmt::print(stderr, "stoker_merge_bench: {}\n", message);
  std::exit(1);
}

void BuildPart(const std::string& dir, std::uint64_t first, std::uint64_t count, bool seekable) {
  constexpr std::uint64_t kPerShard = 640;
  constexpr std::uint32_t kJpegBytes = 100'000;
  const stoker::JpegGeometry geometry{500, 375, 16};
  const std::uint32_t rows = index_format::RegionRows(geometry);
  std::vector<std::uint32_t> table(rows * 16 + 1);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = 600 + static_cast<std::uint32_t>(i) * 250;
  stoker::RegionRecord region;
  region.geometry = geometry;
  region.row_checks.assign(rows, 0x12345678u);
  index_format::IndexBuilder builder;
  std::uint32_t shard = 0;
  std::uint64_t offset = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    if (i % kPerShard == 0) {
      if (i > 0) builder.SetShardContents(shard, offset + 1024, i);
      shard = builder.AddShard(fmt::format("shard-{:06}.tar", i / kPerShard));
      offset = 0;
    }
    const std::uint64_t global = first + i;
    const std::string key = fmt::format("n{:08}/{:08}", global % 1000, global);
    region.rest_check = static_cast<std::uint32_t>(global);
    std::vector<index_format::IndexBuilder::Field> fields = {
        {"cls", offset + 512, 3, index_format::KindCode(stoker::FieldKind::kInt)},
        {"jpg", offset + 1536, kJpegBytes, index_format::KindCode(stoker::FieldKind::kImage)},
        {"txt", offset + 1536 + kJpegBytes + 512, 40, index_format::KindCode(stoker::FieldKind::kText)}};
    if (seekable) {
      fields[1].restarts = table;
      fields[1].geometry = geometry;
      fields[1].region = &region;
    }
    offset += 1536 + kJpegBytes + 1024 + 512;
    auto added = builder.AddSample(shard, key, static_cast<std::int64_t>(global % 1000), global * 2654435761u, fields);
    if (!added.ok()) Die(added.ToString());
  }
  builder.SetShardContents(shard, offset + 1024, count);
  auto bytes = builder.Finish();
  if (!bytes.ok()) Die(bytes.error().ToString());
  std::filesystem::create_directories(dir);
  auto status = stoker::WriteWholeFileAtomically(*stoker::FileSystem::Default(), dir + "/index.stoker", *bytes);
  if (!status.ok()) Die(status.ToString());
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t parts = 32, samples = 1'281'167;
  bool seekable = false;
  std::string work = "build/bench-data/merge";
  int repeat = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--parts" && i + 1 < argc)
      parts = std::max<std::uint64_t>(1, std::stoull(argv[++i]));
    else if (a == "--samples" && i + 1 < argc)
      samples = std::stoull(argv[++i]);
    else if (a == "--seekable")
      seekable = true;
    else if (a == "--work" && i + 1 < argc)
      work = argv[++i];
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else
      Die("usage: stoker_merge_bench [--parts P] [--samples N] [--seekable] [--work DIR] [--repeat R]");
  }
  std::filesystem::remove_all(work);
  std::vector<std::string> part_dirs;
  std::uintmax_t part_bytes = 0;
  const auto built = Clock::now();
  for (std::uint64_t p = 0; p < parts; ++p) {
    const std::uint64_t first = samples * p / parts, last = samples * (p + 1) / parts;
    part_dirs.push_back(fmt::format("{}/part-{:05}", work, p));
    BuildPart(part_dirs.back(), first, last - first, seekable);
    part_bytes += std::filesystem::file_size(part_dirs.back() + "/index.stoker");
  }
  fmt::print("{} parts, {} samples{}: {:.1f} MB of part indexes (built in {:.1f} s)\n", parts, samples,
             seekable ? ", seekable JPEGs" : "", static_cast<double>(part_bytes) / 1e6,
             std::chrono::duration<double>(Clock::now() - built).count());
  for (int r = 0; r < repeat; ++r) {
    const auto start = Clock::now();
    const pid_t child = ::fork();
    if (child < 0) Die("fork");
    if (child == 0) {
      stoker::MergeOptions options;
      options.overwrite = true;
      auto merged = stoker::MergeDatasets(part_dirs, work, options);
      if (!merged.ok()) {
        fmt::print(stderr, "merge: {}\n", merged.error().ToString());
        ::_exit(1);
      }
      ::_exit(0);
    }
    // The mapped part indexes count in RSS as page cache the kernel may drop;
    // the anonymous part is what the merge itself holds (sampled).
    int status = 0;
    struct rusage usage {};
    std::uint64_t peak_anon_kb = 0;
    for (;;) {
      const pid_t done = ::wait4(child, &status, WNOHANG, &usage);
      if (done == child) break;
      if (done < 0) Die("wait4");
      std::ifstream proc(fmt::format("/proc/{}/status", child));
      for (std::string line; std::getline(proc, line);)
        if (line.starts_with("RssAnon:"))
          peak_anon_kb = std::max<std::uint64_t>(peak_anon_kb, std::stoull(line.substr(8)));
      ::usleep(2000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) Die("the merge failed");
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    fmt::print("merge {}: {:.2f} s, peak RSS {:.0f} MiB (anonymous {:.0f} MiB), merged index {:.1f} MB\n", r + 1,
               seconds, static_cast<double>(usage.ru_maxrss) / 1024.0, static_cast<double>(peak_anon_kb) / 1024.0,
               static_cast<double>(std::filesystem::file_size(work + "/index.stoker")) / 1e6);
  }
  return 0;
}
