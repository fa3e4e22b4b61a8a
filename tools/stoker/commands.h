// The `stoker` subcommands. Each returns the process exit code.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cli.h"

namespace stoker_cli {

struct PackArgs {
  std::string source, out, shard_size = "64MiB";
  unsigned threads = 0;
  bool force = false;
  std::uint32_t max_side = 0;
  int quality = 90;
  std::optional<std::uint64_t> shuffle_seed;
  std::vector<std::string> file_columns;
  bool seekable_jpeg = false;
  bool keep_bad_images = false;
};
int RunPack(const PackArgs& args);
int RunIndex(const std::vector<std::string>& shards, const std::string& output, bool force, bool keep_bad_images);
int RunMerge(const std::vector<std::string>& parts, const std::string& output, bool force);
// What `verify` checks of a Megatron token dataset beyond every id being
// a token id: ids below vocab_size (0: any), documents ending with eos.
struct TokenVerifyArgs {
  std::uint64_t vocab_size = 0;
  std::optional<std::int64_t> eos;
};
// A packed dataset, or a Megatron token dataset's prefix (`seq_len`: the
// rows inspect shows).
int RunInspect(const std::string& location, const RemoteArgs& remote, bool json, std::uint64_t images,
               std::uint64_t seq_len);
// A URL that is neither a packed dataset nor a token prefix: both are said.
[[nodiscard]] stoker::Status NotTokensEither(const std::string& location, const stoker::Status& error);
int RunVerify(const std::string& location, const RemoteArgs& remote, bool json, bool decode,
              const TokenVerifyArgs& tokens);
// Megatron token datasets (token_commands.cc). TokenPrefixFor: the prefix
// when `location` is one (a URL is tried as one when opening it as a packed
// dataset failed with `open_error` NotFound).
std::optional<std::string> TokenPrefixFor(const std::string& location, const stoker::Status& open_error,
                                          const RemoteArgs& remote);
int RunInspectTokens(const std::string& prefix, const RemoteArgs& remote, bool json, std::uint64_t seq_len);
int RunVerifyTokens(const std::string& prefix, const RemoteArgs& remote, bool json, const TokenVerifyArgs& args);
int RunList(const std::string& location, const RemoteArgs& remote, bool json);

struct BenchArgs {
  std::string dataset;
  std::uint32_t batch_size = 64, threads = 0, prefetch = 0, shard_window = 0;
  std::uint64_t epochs = 1, max_batches = 0;
  std::string seed = "0";
  double consumer_ms = 0;
  std::string dtype = "float32", order = "auto", on_corrupt = "error", kernel_readahead = "auto";
  int size = 224;
  bool eval = false, json = false, no_verify = false;
  RemoteArgs remote;
  // A token dataset's PREFIX: rows of seq_len tokens, batch_size rows a batch.
  std::uint64_t seq_len = 2048;
  // Options given that only the image loader has (refused for a token dataset).
  std::vector<std::string> image_options_given;
};
int RunBench(const BenchArgs& args);
int RunBenchTokens(const std::string& prefix, const BenchArgs& args);

int RunCacheStatOrClear(bool clear, const RemoteArgs& remote, bool json);
int RunCacheWarm(const std::string& location, const RemoteArgs& remote, bool json);

int RunCheckpointList(const std::string& directory, bool json);
int RunCheckpointVerify(const std::string& path, bool json);

struct GpuRunArgs {
  std::string memory, tenant, ledger, leases, policy = "binpack";
  std::vector<std::string> device_memory;  // ORDINAL=SIZE
  std::optional<unsigned> compute, gpus;
  std::optional<std::string> wait;  // "": no limit
  bool no_place = false;
  bool quiet = false;
  std::vector<std::string> command;
};
int RunGpuRun(const GpuRunArgs& args);

// `stoker gpu device-plugin ARGS...`: runs stoker-device-plugin ARGS...
int RunGpuDevicePluginCommand(int argc, char** argv);

struct GpuExtenderArgs {
  std::string listen = "0.0.0.0:8888", policy = "binpack", node_url = "http://{address}:9453/cards";
  double fetch_timeout = 2, cache_seconds = 1;
};
int RunGpuExtenderCommand(const GpuExtenderArgs& args);
int RunGpuList(const std::string& ledger, const std::string& leases, bool json);
struct GpuAgentArgs {
  std::string dir;
  double interval_seconds = 5;
  bool once = false;
};
int RunGpuAgent(const GpuAgentArgs& args);

struct DoctorArgs {
  std::string out;
  std::optional<unsigned> prometheus_port;
  std::vector<std::string> command;
};
// Replaces the process with `python3 -m stoker.doctor ...`; returns only on failure.
int RunDoctor(const DoctorArgs& args);
// Replaces the process with Python's `stoker.tokenize` main, given `args`; returns only on failure.
int RunTokenize(const std::vector<std::string>& args);
// `stoker pack X.parquet OUT ...`: Parquet is read by pyarrow, so this runs
// stoker._parquet's main with the same options.
int RunPackParquet(const PackArgs& args);

}  // namespace stoker_cli
