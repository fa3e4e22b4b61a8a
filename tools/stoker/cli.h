// Shared by the `stoker` subcommands: the error convention (one line on
// stderr, "stoker: error: <kind>: <what and where>", exit status 1), the
// remote-data options and opening a dataset by location. The CLI uses the
// public API (include/stoker/) only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "stoker/dataset.h"
#include "stoker/open.h"
#include "stoker/status.h"

namespace stoker_cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;  // bad input, failed operation, or a dataset that fails verification

// Prints `status` as "stoker: error: ..." and returns kExitError.
int Fail(const stoker::Status& status);
void Warn(const std::string& message);

// --cache-dir, --cache-size, ... for commands that read remote datasets.
struct RemoteArgs {
  std::string cache_dir;
  std::string cache_size = "16GiB";
  std::string min_free = "1GiB";
  std::uint32_t connections = 8;
  std::uint32_t max_attempts = 8;
  double fetch_deadline = 300;
  double stall_timeout = 30;
};
void AddRemoteOptions(CLI::App* command, RemoteArgs& args);
[[nodiscard]] stoker::Result<stoker::OpenOptions> OpenOptionsFrom(const RemoteArgs& args);
// OpenDataset with those options; notes on stderr when a folder is read as
// an ImageFolder of loose files.
[[nodiscard]] stoker::Result<std::unique_ptr<stoker::Dataset>> Open(const std::string& location,
                                                                    const RemoteArgs& args);

// --seed: a decimal integer from 0 to 2^64 - 1 (CLI11 would wrap "-1").
[[nodiscard]] stoker::Result<std::uint64_t> ParseSeed(const std::string& text);
// This process's CPU seconds (user and system) and peak resident memory.
double CpuSeconds();
std::uint64_t PeakRssBytes();

}  // namespace stoker_cli
