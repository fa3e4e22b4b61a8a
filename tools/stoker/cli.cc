#include "cli.h"

#include <sys/resource.h>

#include <charconv>

#include <fmt/format.h>

#include "stoker/byte_size.h"
#include "stoker/text.h"

namespace stoker_cli {

int Fail(const stoker::Status& status) {
  fmt::print(stderr, "stoker: error: {}\n", stoker::RedactUrlsIn(status.ToString()));
  return kExitError;
}

void Warn(const std::string& message) {
  fmt::print(stderr, "stoker: warning: {}\n", message);
}

void AddRemoteOptions(CLI::App* command, RemoteArgs& args) {
  command->add_option("--cache-dir", args.cache_dir,
                      "Cache folder for remote datasets (default: $STOKER_CACHE_DIR or ~/.cache/stoker)");
  command->add_option("--cache-size", args.cache_size, "Cache capacity, e.g. 2GiB")->capture_default_str();
  command->add_option("--cache-min-free", args.min_free, "Free space to leave on the cache's file system")
      ->capture_default_str();
  command->add_option("--connections", args.connections, "Parallel downloads (1-256)")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  command
      ->add_option("--max-attempts", args.max_attempts,
                   "Attempts per object before giving up (timeouts, resets, 5xx, 429); at least 1")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  command
      ->add_option("--fetch-deadline", args.fetch_deadline,
                   "Seconds one object's download may take, every attempt included")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1e7));
  command
      ->add_option("--stall-timeout", args.stall_timeout,
                   "Seconds a transfer may stay below 1 KiB/s before the attempt counts as stalled")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e7));
}

stoker::Result<stoker::OpenOptions> OpenOptionsFrom(const RemoteArgs& args) {
  stoker::OpenOptions o;
  o.remote.cache.dir = args.cache_dir;
  auto size = stoker::ParseByteSize(args.cache_size);
  if (!size.ok()) return size.error().WithContext("--cache-size");
  if (*size == 0) return stoker::Status::InvalidArgument("--cache-size must be above zero");
  o.remote.cache.capacity_bytes = *size;
  auto floor = stoker::ParseByteSize(args.min_free);
  if (!floor.ok()) return floor.error().WithContext("--cache-min-free");
  o.remote.cache.min_free_bytes = *floor;
  o.remote.connections = args.connections;
  o.remote.max_attempts = args.max_attempts;
  o.remote.fetch_deadline_seconds = args.fetch_deadline;
  o.remote.stall_timeout_seconds = args.stall_timeout;
  return o;
}

stoker::Result<std::unique_ptr<stoker::Dataset>> Open(const std::string& location, const RemoteArgs& args) {
  STOKER_ASSIGN_OR_RETURN(auto options, OpenOptionsFrom(args));
  STOKER_ASSIGN_OR_RETURN(auto dataset, stoker::OpenDataset(location, options));
  if (dataset->loose_files())
    fmt::print(stderr,
               "stoker: note: '{}' has no {}; reading it as an ImageFolder of loose files ({}; "
               "`stoker pack` makes it faster)\n",
               location, stoker::kIndexFileName, stoker::Counted(dataset->num_samples(), "sample", "samples"));
  return dataset;
}

// A seed: a decimal integer from 0 to 2^64 - 1 (CLI11 would wrap "-1").
stoker::Result<std::uint64_t> ParseSeed(const std::string& text) {
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size())
    return stoker::Status::InvalidArgument(
        fmt::format("--seed '{}' is not an integer from 0 to 2^64-1", stoker::Printable(text)));
  return value;
}

double CpuSeconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) * 1e-6; };
  return sec(usage.ru_utime) + sec(usage.ru_stime);
}

std::uint64_t PeakRssBytes() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<std::uint64_t>(usage.ru_maxrss) * 1024;
}

}  // namespace stoker_cli
