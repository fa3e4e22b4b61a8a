// `stoker bench`: the loader over a dataset, measured per epoch: images/s,
// consumer wait, CPU per image, memory; with --consumer-ms a simulated
// accelerator step and its utilisation.
#include <sys/resource.h>
#include <unistd.h>

#include <charconv>
#include <chrono>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "simulated_step.h"
#include "stoker/byte_size.h"
#include "stoker/device.h"
#include "stoker/loader.h"
#include "stoker/remote.h"
#include "stoker/text.h"

namespace stoker_cli {
namespace {

using stoker::Status;

constexpr double kWarnDownloadTimes = 1.5;

// Runs the loader over the dataset and reports throughput, consumer wait,
// CPU cost and memory; with --consumer-ms, a simulated accelerator step per
// batch and the resulting accelerator utilisation (time computing / wall time,
// as MLPerf Storage defines AU).
}  // namespace

int RunBench(const BenchArgs& a) {
  auto seed = ParseSeed(a.seed);
  if (!seed.ok()) return Fail(seed.error());
  if (auto valid = SimulatedStep::Check(a.consumer_ms); !valid.ok()) return Fail(valid);
  if (auto prefix = TokenPrefixFor(a.dataset, stoker::Status::Ok(), a.remote)) return RunBenchTokens(*prefix, a);
  auto opened = Open(a.dataset, a.remote);
  if (!opened.ok()) {
    if (auto prefix = TokenPrefixFor(a.dataset, opened.error(), a.remote)) return RunBenchTokens(*prefix, a);
    return Fail(opened.error());
  }
  if (a.seq_len != BenchArgs{}.seq_len)
    return Fail(stoker::Status::InvalidArgument("--seq-len is for Megatron token datasets"));
  std::shared_ptr<const stoker::Dataset> dataset = std::move(opened).value();
  const bool remote = stoker::IsRemoteLocation(a.dataset);
  std::uint64_t dataset_bytes = 0;
  for (const auto& shard : dataset->shards()) dataset_bytes += shard.size;
  stoker::LoaderOptions o;
  o.batch_size = a.batch_size;
  o.threads = a.threads;
  o.prefetch = a.prefetch;
  o.seed = *seed;
  o.verify_samples = !a.no_verify;
  o.shuffle = a.order != "sequential";
  o.order = a.order == "shard-block" ? stoker::Order::kShardBlockShuffle
            : a.order == "shuffle"   ? stoker::Order::kShuffle
                                     : stoker::Order::kAuto;
  o.shard_window = a.shard_window;
  o.kernel_readahead = a.kernel_readahead == "on"    ? stoker::KernelReadahead::kOn
                       : a.kernel_readahead == "off" ? stoker::KernelReadahead::kOff
                                                     : stoker::KernelReadahead::kAuto;
  o.on_corrupt = a.on_corrupt == "skip" ? stoker::CorruptPolicy::kSkip : stoker::CorruptPolicy::kError;
  auto& t = o.transform;
  t.width = t.height = a.size;
  if (a.eval) {
    t.kind = stoker::TransformOptions::Kind::kResizeCenterCrop;
    t.resize = a.size * 256 / 224;
    t.flip_probability = 0;
  }
  if (a.dtype == "float32")
    t.dtype = stoker::DType::kFloat32;
  else if (a.dtype == "float16")
    t.dtype = stoker::DType::kFloat16;
  else if (a.dtype == "bfloat16")
    t.dtype = stoker::DType::kBFloat16;
  else if (a.dtype == "uint8") {
    t.dtype = stoker::DType::kUint8;
    t.layout = stoker::Layout::kNHWC;
    t.normalize = false;
  } else {
    return Fail(
        Status::InvalidArgument(fmt::format("--dtype '{}': expected float32, float16, bfloat16 or uint8", a.dtype)));
  }
  auto loader = stoker::Loader::Create(dataset, o);
  if (!loader.ok()) return Fail(loader.error());
  auto& l = **loader;
  const stoker::LoaderStats chosen = l.stats();
  const std::string order_name = chosen.order == stoker::Order::kShardBlockShuffle ? "shard-block"
                                 : chosen.order == stoker::Order::kSequential      ? "sequential"
                                                                                   : "shuffle";
  if (!a.json)
    fmt::print("bench {}: {}, batch {}, {}, prefetch {}, {}{}, {} {}x{}{}\n", stoker::Printable(dataset->index_path()),
               stoker::Counted(dataset->num_samples(), "sample", "samples"), a.batch_size,
               stoker::Counted(chosen.threads, "thread", "threads"), chosen.prefetch, order_name,
               chosen.order == stoker::Order::kShardBlockShuffle
                   ? fmt::format(" (window {})", stoker::Counted(chosen.shard_window, "shard", "shards"))
                   : "",
               a.dtype, a.size, a.size, a.consumer_ms > 0 ? fmt::format(", simulated step {} ms", a.consumer_ms) : "");
  if (!chosen.corrupt_note.empty()) Warn(chosen.corrupt_note);
  // Remote: what the order will download, said before the first epoch (a
  // warning on stderr when it is well over the dataset).
  if (!chosen.order_note.empty()) {
    if (chosen.order_warning)
      Warn(chosen.order_note);
    else if (!a.json)
      fmt::print("{}\n", chosen.order_note);
  }
  if (!a.json && !chosen.readahead_note.empty()) fmt::print("{}\n", chosen.readahead_note);
  if (!a.json) {
    fmt::print("batch buffers: {}\n",
               l.stats().pinned_memory ? "page-locked (CUDA)"
                                       : fmt::format("page-aligned, not page-locked: {}", stoker::QueryCuda().reason));
  }
  SimulatedStep step(a.consumer_ms);
  for (std::uint64_t e = 0; e < a.epochs; ++e) {
    const auto before = l.stats();
    const auto remote_before = stoker::GetRemoteStats(*dataset);
    const double cpu0 = CpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t batches = 0, images = 0;
    step.StartEpoch();
    while (true) {
      auto next = l.Next();
      if (!next.ok()) return Fail(next.error());
      if (!next->has_value()) break;
      images += (*next)->size();
      ++batches;
      step.Run();
      if (a.max_batches && batches >= a.max_batches) {
        next->reset();
        l.SetEpoch(e + 1);
        break;
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = CpuSeconds() - cpu0;
    const auto after = l.stats();
    const stoker::LoaderStats epoch_stats = after.Since(before);
    const double ips = images / wall;
    const auto remote_after = stoker::GetRemoteStats(*dataset);
    const std::uint64_t downloaded = remote_after.bytes_downloaded - remote_before.bytes_downloaded;
    const std::uint64_t hits = remote_after.hits - remote_before.hits;
    const std::uint64_t misses = remote_after.misses - remote_before.misses;
    const double amplification = dataset_bytes ? static_cast<double>(downloaded) / dataset_bytes : 0.0;
    // A measured epoch that downloaded well over the dataset is said, not
    // only printed as a figure.
    if (remote && amplification > kWarnDownloadTimes)
      Warn(fmt::format(
          "epoch {} downloaded {} ({:.1f}x the dataset, {}): the cache (--cache-size {}) is smaller "
          "than this order's working set; use --order auto or shard-block, or a larger --cache-size",
          e, stoker::FormatBytes(downloaded), amplification, stoker::FormatBytes(dataset_bytes), a.remote.cache_size));
    const double hit_rate = hits + misses ? static_cast<double>(hits) / (hits + misses) : 0.0;
    if (a.json) {
      nlohmann::json j = {{"epoch", e},
                          {"batches", batches},
                          {"images", images},
                          {"wall_s", wall},
                          {"images_per_s", ips},
                          {"mb_per_s", static_cast<double>(epoch_stats.bytes_read) / wall / 1e6},
                          {"consumer_wait_s", epoch_stats.wait_seconds},
                          {"cpu_s_per_image", images ? cpu / images : 0.0},
                          {"peak_rss_bytes", PeakRssBytes()},
                          {"threads", after.threads},
                          {"prefetch", after.prefetch},
                          {"batch_buffers_touched", after.batch_buffers_touched},
                          {"shard_window", after.shard_window},
                          {"order", order_name},
                          {"corrupt_skipped", epoch_stats.corrupt_skipped},
                          {"read_s", epoch_stats.read_seconds},
                          {"decode_s", epoch_stats.decode_seconds},
                          {"transform_s", epoch_stats.transform_seconds},
                          {"read_requests", epoch_stats.read_requests},
                          {"read_method", after.read_method},
                          {"kernel_readahead", after.kernel_readahead}};
      if (remote) {
        j["bytes_downloaded"] = downloaded;
        j["predicted_bytes_downloaded"] = chosen.predicted_epoch_download_bytes;
        j["read_amplification"] = amplification;
        j["cache_hit_rate"] = hit_rate;
        j["cache_wait_s"] = remote_after.wait_seconds - remote_before.wait_seconds;
        j["download_retries"] = remote_after.retries - remote_before.retries;
        j["cache_evictions"] = remote_after.evictions - remote_before.evictions;
        j["connections_opened"] = remote_after.connections - remote_before.connections;
      }
      step.AddTo(j, wall);
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("epoch {}: {}\n", e, epoch_stats.Summary(wall));
      if (remote)
        fmt::print(
            "epoch {}: downloaded {} ({:.2f}x the dataset), cache hit rate {:.1f}%, waited {:.2f} s for "
            "downloads, {} retries, {} connections opened\n",
            e, stoker::FormatBytes(downloaded), amplification, 100.0 * hit_rate,
            remote_after.wait_seconds - remote_before.wait_seconds, remote_after.retries - remote_before.retries,
            remote_after.connections - remote_before.connections);
      fmt::print("epoch {}: {:.0f} images/s, {:.2f} ms CPU per image, peak RSS {}", e, ips,
                 images ? 1000.0 * cpu / images : 0.0, stoker::FormatBytes(PeakRssBytes()));
      fmt::print("{}\n", step.Text(wall));
    }
  }
  return kExitOk;
}

}  // namespace stoker_cli
