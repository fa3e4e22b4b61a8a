// Reads every sample's bytes from loose files and from packed shards, with a
// cold page cache (evicted with posix_fadvise(POSIX_FADV_DONTNEED)) and warm,
// and prints files/s, MB/s and the speed-up.
//
//   stoker_read_bench --loose DIR --packed DATASET [--repeat N] [--max-samples N]
//                     [--emulate-device IOPS,MBPS] [--json]
//
// DIR is the ImageFolder tree that was packed into DATASET. Reads are
// single-threaded in every mode, so the comparison is of access patterns.
//
// --emulate-device runs the reads in a block-I/O cgroup that caps reads from
// the disk holding the data at IOPS requests and MBPS MB per second (root
// only; cgroup v1 blkio or v2 io), to measure the same data as it would read
// from slower storage, e.g. 200,200 for a hard disk or 3000,125 for a cloud
// volume's baseline.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sys/sysmacros.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/unique_fd.h"
#include "stoker/dataset.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Measurement {
  std::string mode;
  bool cold = false;
  std::uint64_t files = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;
  [[nodiscard]] double files_per_s() const { return static_cast<double>(files) / seconds; }
  [[nodiscard]] double mb_per_s() const { return static_cast<double>(bytes) / 1e6 / seconds; }
};

[[noreturn]] void Die(const std::string& message) {
  fmt::print(stderr, "stoker_read_bench: {}\n", message);
  std::exit(1);
}

void Evict(const std::vector<std::string>& paths) {
  ::sync();  // dirty pages cannot be dropped
  for (const auto& p : paths) {
    stoker::UniqueFd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Die(fmt::format("open '{}': {}", p, std::strerror(errno)));
    ::fdatasync(fd.get());
    if (::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED) != 0) Die(fmt::format("fadvise '{}'", p));
  }
}

std::uint64_t ReadFully(int fd, std::uint64_t offset, std::uint64_t size, std::vector<char>& buffer,
                        const std::string& what) {
  if (buffer.size() < size) buffer.resize(size);
  std::uint64_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, buffer.data() + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      Die(fmt::format("read '{}' at {}: {}", what, offset + done, n == 0 ? "unexpected end" : std::strerror(errno)));
    done += static_cast<std::uint64_t>(n);
  }
  return done;
}

// Moves this process into a cgroup that throttles reads from one block device;
// moves it back and removes the cgroup on destruction.
class DeviceThrottle {
 public:
  DeviceThrottle(const std::string& data_path, std::uint64_t iops, std::uint64_t mb_per_s) {
    struct stat st {};
    if (::stat(data_path.c_str(), &st) != 0) Die(fmt::format("stat '{}': {}", data_path, std::strerror(errno)));
    device_ = WholeDisk(major(st.st_dev), minor(st.st_dev));
    const std::string name = fmt::format("stoker-bench-{}", ::getpid());
    if (std::filesystem::exists("/sys/fs/cgroup/blkio")) {
      root_ = "/sys/fs/cgroup/blkio";
      group_ = root_ + "/" + name;
      std::filesystem::create_directory(group_);
      Write(group_ + "/blkio.throttle.read_iops_device", fmt::format("{} {}", device_, iops));
      Write(group_ + "/blkio.throttle.read_bps_device", fmt::format("{} {}", device_, mb_per_s * 1'000'000));
    } else if (std::filesystem::exists("/sys/fs/cgroup/cgroup.controllers")) {
      root_ = "/sys/fs/cgroup";
      group_ = root_ + "/" + name;
      Write(root_ + "/cgroup.subtree_control", "+io");
      std::filesystem::create_directory(group_);
      Write(group_ + "/io.max", fmt::format("{} riops={} rbps={}", device_, iops, mb_per_s * 1'000'000));
    } else {
      Die("--emulate-device needs cgroup v1 blkio or cgroup v2 io under /sys/fs/cgroup");
    }
    Write(group_ + "/cgroup.procs", std::to_string(::getpid()));
  }
  ~DeviceThrottle() {
    std::ofstream(root_ + "/cgroup.procs") << ::getpid();
    std::error_code ec;
    std::filesystem::remove(group_, ec);
  }
  [[nodiscard]] const std::string& device() const { return device_; }

 private:
  static void Write(const std::string& path, const std::string& value) {
    std::ofstream out(path);
    out << value;
    out.flush();
    if (!out) Die(fmt::format("cannot write '{}' to {} (root is needed for --emulate-device)", value, path));
  }
  // Throttling applies to whole disks: map a partition to its disk.
  static std::string WholeDisk(unsigned maj, unsigned min) {
    const std::string sys = fmt::format("/sys/dev/block/{}:{}", maj, min);
    if (std::filesystem::exists(sys + "/partition")) {
      std::ifstream in(sys + "/../dev");
      std::string dev;
      if (in >> dev) return dev;
    }
    return fmt::format("{}:{}", maj, min);
  }
  std::string device_, root_, group_;
};

Measurement ReadLoose(const std::vector<std::string>& files) {
  Measurement m{"loose files", false, 0, 0, 0};
  std::vector<char> buffer;
  auto start = Clock::now();
  for (const auto& path : files) {
    stoker::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Die(fmt::format("open '{}': {}", path, std::strerror(errno)));
    struct stat st {};
    ::fstat(fd.get(), &st);
    m.bytes += ReadFully(fd.get(), 0, static_cast<std::uint64_t>(st.st_size), buffer, path);
    ++m.files;
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return m;
}

// One pread per sample (the span of its fields), in index order; with
// `coalesce`, neighbouring samples merge into reads of about 1 MiB (larger
// reads were slower on the development machine's virtio disk).
Measurement ReadPacked(const stoker::Dataset& dataset, bool coalesce, std::uint64_t max_samples) {
  Measurement m{coalesce ? "packed, ~1 MiB coalesced reads" : "packed, one read per sample", false, 0, 0, 0};
  constexpr std::uint64_t kMaxRead = 1 << 20;
  std::vector<char> buffer;
  auto start = Clock::now();
  for (const auto& shard : dataset.shards()) {
    stoker::UniqueFd fd(::open(shard.full_path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Die(fmt::format("open '{}': {}", shard.full_path, std::strerror(errno)));
    std::uint64_t run_start = 0, run_end = 0;
    auto flush = [&] {
      if (run_end > run_start) ReadFully(fd.get(), run_start, run_end - run_start, buffer, shard.full_path);
      run_start = run_end = 0;
    };
    const std::uint64_t end = std::min(shard.first_sample + shard.num_samples, max_samples);
    for (std::uint64_t i = shard.first_sample; i < end; ++i) {
      auto info = dataset.Sample(i);
      if (!info.ok()) Die(info.error().ToString());
      std::uint64_t lo = UINT64_MAX, hi = 0;
      for (const auto& f : info->fields) {
        if (!f) continue;
        lo = std::min(lo, f->offset);
        hi = std::max(hi, f->offset + f->size);
        m.bytes += f->size;
      }
      ++m.files;
      if (lo == UINT64_MAX) continue;
      if (!coalesce) {
        ReadFully(fd.get(), lo, hi - lo, buffer, shard.full_path);
        continue;
      }
      if (run_end != 0 && (hi - run_start > kMaxRead)) flush();
      if (run_end == 0) run_start = lo;
      run_end = hi;
    }
    flush();
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return m;
}

// The storage's sequential-read ceiling: the same shard bytes in 1 MiB reads.
Measurement ReadRaw(const std::vector<std::pair<std::string, std::uint64_t>>& spans) {
  Measurement m{"raw sequential (device ceiling)", false, 0, 0, 0};
  std::vector<char> buffer(1 << 20);
  auto start = Clock::now();
  for (const auto& [path, length] : spans) {
    stoker::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) Die(fmt::format("open '{}': {}", path, std::strerror(errno)));
    for (std::uint64_t offset = 0; offset < length;) {
      offset += ReadFully(fd.get(), offset, std::min<std::uint64_t>(buffer.size(), length - offset), buffer, path);
    }
    m.bytes += length;
  }
  m.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return m;
}

// How much of each shard holds the first `max_samples` samples.
std::vector<std::pair<std::string, std::uint64_t>> ShardSpans(const stoker::Dataset& dataset,
                                                              std::uint64_t max_samples) {
  std::vector<std::pair<std::string, std::uint64_t>> spans;
  for (const auto& shard : dataset.shards()) {
    if (shard.first_sample >= max_samples) break;
    std::uint64_t length = shard.size;
    if (shard.first_sample + shard.num_samples > max_samples) {
      auto last = dataset.Sample(max_samples - 1);
      if (!last.ok()) Die(last.error().ToString());
      length = 0;
      for (const auto& f : last->fields)
        if (f) length = std::max(length, f->offset + f->size);
    }
    spans.emplace_back(shard.full_path, length);
  }
  return spans;
}

}  // namespace

int main(int argc, char** argv) {
  std::string loose_dir, packed;
  int repeat = 3;
  bool json = false;
  std::uint64_t max_samples = UINT64_MAX, emulate_iops = 0, emulate_mbps = 0;
  const char* usage =
      "usage: stoker_read_bench --loose DIR --packed DATASET [--repeat N] [--max-samples N] "
      "[--emulate-device IOPS,MBPS] [--json]";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--loose" && i + 1 < argc)
      loose_dir = argv[++i];
    else if (a == "--packed" && i + 1 < argc)
      packed = argv[++i];
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::max(1, std::atoi(argv[++i]));
    else if (a == "--json")
      json = true;
    else if (a == "--max-samples" && i + 1 < argc)
      max_samples = std::stoull(argv[++i]);
    else if (a == "--emulate-device" && i + 1 < argc) {
      if (std::sscanf(argv[++i], "%lu,%lu", &emulate_iops, &emulate_mbps) != 2 || !emulate_iops || !emulate_mbps)
        Die("--emulate-device wants IOPS,MBPS, e.g. 200,200");
    } else
      Die(usage);
  }
  if (loose_dir.empty() || packed.empty()) Die(usage);

  std::vector<std::string> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(loose_dir))
    if (e.is_regular_file()) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.size() > max_samples) files.resize(max_samples);
  auto dataset = stoker::Dataset::Open(packed);
  if (!dataset.ok()) Die(dataset.error().ToString());
  std::vector<std::string> shard_paths;
  for (const auto& s : (*dataset)->shards()) shard_paths.push_back(s.full_path);
  const std::uint64_t samples = std::min(max_samples, (*dataset)->num_samples());
  if (files.size() != samples) fmt::print(stderr, "note: {} loose files, {} packed samples\n", files.size(), samples);
  std::optional<DeviceThrottle> throttle;
  if (emulate_iops) throttle.emplace(loose_dir, emulate_iops, emulate_mbps);

  // Best of `repeat` runs for each mode and cache state.
  std::vector<Measurement> results;
  auto best = [&](auto run, bool cold, const std::vector<std::string>& evict) {
    Measurement b;
    for (int r = 0; r < repeat; ++r) {
      if (cold) Evict(evict);
      Measurement m = run();
      m.cold = cold;
      if (r == 0 || m.seconds < b.seconds) b = m;
    }
    results.push_back(b);
  };
  for (bool cold : {true, false}) {
    best([&] { return ReadLoose(files); }, cold, files);
    best([&] { return ReadPacked(**dataset, false, max_samples); }, cold, shard_paths);
    best([&] { return ReadPacked(**dataset, true, max_samples); }, cold, shard_paths);
  }
  Measurement ceiling;
  for (int r = 0; r < repeat; ++r) {
    Evict(shard_paths);
    Measurement m = ReadRaw(ShardSpans(**dataset, max_samples));
    m.cold = true;
    if (r == 0 || m.seconds < ceiling.seconds) ceiling = m;
  }

  if (json) {
    nlohmann::json out = nlohmann::json::array();
    results.push_back(ceiling);
    for (const auto& m : results)
      out.push_back({{"mode", m.mode},
                     {"cache", m.cold ? "cold" : "warm"},
                     {"files", m.files},
                     {"bytes", m.bytes},
                     {"seconds", m.seconds},
                     {"files_per_s", m.files_per_s()},
                     {"mb_per_s", m.mb_per_s()}});
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("read every sample: {} files, {:.1f} MB, best of {}\n", files.size(),
             static_cast<double>(results[0].bytes) / 1e6, repeat);
  if (throttle)
    fmt::print("storage: disk {} throttled to {} read IOPS and {} MB/s (emulated slower device)\n", throttle->device(),
               emulate_iops, emulate_mbps);
  fmt::print("{:<6} {:<30} {:>12} {:>10} {:>9}\n", "cache", "mode", "files/s", "MB/s", "speed-up");
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& m = results[i];
    const auto& loose = results[i / 3 * 3];
    fmt::print("{:<6} {:<30} {:>12.0f} {:>10.1f} {:>8.1f}x\n", m.cold ? "cold" : "warm", m.mode, m.files_per_s(),
               m.mb_per_s(), loose.seconds / m.seconds);
  }
  const Measurement& cold_loose = results[0];
  fmt::print("cold   {:<30} {:>12} {:>10.1f} {:>8.1f}x   <- the same bytes read sequentially: the disk's rate\n",
             ceiling.mode, "", ceiling.mb_per_s(), ceiling.mb_per_s() / cold_loose.mb_per_s());
  fmt::print(
      "\npacked shards (coalesced reads) read {:.1f}x faster than loose files with a cold cache ({:.1f}x warm)\n",
      results[0].seconds / results[2].seconds, results[3].seconds / results[5].seconds);
  return 0;
}
