// The `stoker` command line: pack, index, inspect, verify, ls, bench, checkpoint.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint_commands.h"
#include "core/byte_size.h"
#include "core/cuda_runtime.h"
#include "core/progress.h"
#include "stoker/dataset.h"
#include "stoker/loader.h"
#include "stoker/pack.h"
#include "stoker/remote.h"

namespace {

using stoker::Status;

constexpr int kExitOk = 0;
constexpr int kExitError = 1;  // bad input, failed operation, or a dataset that fails verification

int Fail(const Status& status) {
  fmt::print(stderr, "stoker: error: {}\n", status.ToString());
  return kExitError;
}

int RunPack(const std::string& source, const std::string& out, const std::string& shard_size, unsigned threads,
            bool force) {
  auto target = stoker::ParseByteSize(shard_size);
  if (!target.ok()) return Fail(target.error().WithContext("--shard-size"));
  stoker::PackOptions options;
  options.target_shard_bytes = *target;
  options.threads = threads;
  options.overwrite = force;
  std::optional<stoker::ProgressBar> bar;
  options.on_progress = [&](const stoker::PackProgress& p) {
    if (!bar) bar.emplace("pack", "samples", p.samples_total);
    bar->Update(p.samples_done, p.bytes_done);
  };
  auto summary = stoker::Pack(source, out, options);
  if (bar) bar->Finish();
  if (!summary.ok()) return Fail(summary.error());
  for (const auto& w : summary->warnings) fmt::print(stderr, "stoker: warning: {}\n", w);
  fmt::print("packed {} samples into {} shards ({}; payload {}) in {}\n", summary->samples, summary->shards,
             stoker::FormatBytes(summary->shard_bytes), stoker::FormatBytes(summary->payload_bytes), out);
  if (!summary->class_names.empty())
    fmt::print("labels: {} classes, from the sorted class names\n", summary->class_names.size());
  fmt::print("index: {}\n", summary->index_path);
  return kExitOk;
}

int RunIndex(const std::vector<std::string>& shards, const std::string& output, bool force) {
  stoker::IndexOptions options;
  options.output = output;
  options.overwrite = force;
  std::optional<stoker::ProgressBar> bar;
  options.on_progress = [&](std::uint64_t done, std::uint64_t total) {
    if (!bar) bar.emplace("index", "shards", total);
    bar->Update(done, 0);
  };
  auto summary = stoker::IndexShards(shards, options);
  if (bar) bar->Finish();
  if (!summary.ok()) return Fail(summary.error());
  fmt::print("indexed {} samples in {} shards ({})", summary->samples, summary->shards,
             stoker::FormatBytes(summary->shard_bytes));
  if (summary->skipped_members)
    fmt::print("; skipped {} non-file or __*__ members as WebDataset does", summary->skipped_members);
  fmt::print("\nindex: {}\n", summary->index_path);
  return kExitOk;
}

// Where remote datasets are cached (--cache-dir, --cache-size, --connections).
struct RemoteArgs {
  std::string cache_dir;
  std::string cache_size = "16GiB";
  std::string min_free = "1GiB";
  std::uint32_t connections = 8;
  std::uint32_t max_attempts = 8;
};
RemoteArgs g_remote;

stoker::Result<stoker::RemoteOptions> RemoteOptionsFromArgs() {
  stoker::RemoteOptions o;
  o.cache.dir = g_remote.cache_dir;
  auto size = stoker::ParseByteSize(g_remote.cache_size);
  if (!size.ok()) return size.error().WithContext("--cache-size");
  o.cache.capacity_bytes = *size;
  auto floor = stoker::ParseByteSize(g_remote.min_free);
  if (!floor.ok()) return floor.error().WithContext("--cache-min-free");
  o.cache.min_free_bytes = *floor;
  o.connections = g_remote.connections;
  o.max_attempts = g_remote.max_attempts;
  return o;
}

void AddRemoteOptions(CLI::App* command) {
  command->add_option("--cache-dir", g_remote.cache_dir,
                      "Cache folder for remote datasets (default: $STOKER_CACHE_DIR or ~/.cache/stoker)");
  command->add_option("--cache-size", g_remote.cache_size, "Cache capacity, e.g. 2GiB")->capture_default_str();
  command->add_option("--cache-min-free", g_remote.min_free, "Free space to leave on the cache's file system")
      ->capture_default_str();
  command->add_option("--connections", g_remote.connections, "Parallel downloads")->capture_default_str();
  command
      ->add_option("--max-attempts", g_remote.max_attempts,
                   "Attempts per request before giving up (timeouts, resets, 5xx, 429)")
      ->capture_default_str();
}

// A local dataset, or a remote one (http, https, s3) through the cache.
stoker::Result<std::unique_ptr<stoker::Dataset>> OpenForCli(const std::string& path) {
  if (!stoker::IsRemoteLocation(path)) return stoker::Dataset::Open(path);
  STOKER_ASSIGN_OR_RETURN(auto options, RemoteOptionsFromArgs());
  return stoker::OpenDataset(path, options);
}

int RunInspect(const std::string& path, bool json) {
  auto dataset = OpenForCli(path);
  if (!dataset.ok()) return Fail(dataset.error());
  auto summary = stoker::Summarize(**dataset);
  if (!summary.ok()) return Fail(summary.error());
  const auto& s = *summary;
  if (json) {
    nlohmann::json out;
    out["index"] = (*dataset)->index_path();
    out["samples"] = s.num_samples;
    out["shards"] = s.num_shards;
    out["shard_bytes"] = s.shard_bytes;
    out["field_names"] = (*dataset)->field_names();
    out["fields"] = nlohmann::json::array();
    for (const auto& f : s.fields)
      out["fields"].push_back({{"name", f.name}, {"samples", f.samples}, {"bytes", f.bytes}});
    nlohmann::json labels = nlohmann::json::object();
    for (const auto& [label, count] : s.label_counts) labels[std::to_string(label)] = count;
    out["labels"] = labels;
    out["num_classes"] = s.label_counts.size();
    out["unlabelled"] = s.unlabelled;
    out["shard_list"] = nlohmann::json::array();
    for (const auto& shard : (*dataset)->shards())
      out["shard_list"].push_back({{"path", shard.path}, {"bytes", shard.size}, {"samples", shard.num_samples}});
    fmt::print("{}\n", out.dump(2));
    return kExitOk;
  }
  fmt::print("dataset  {}\n", (*dataset)->index_path());
  fmt::print("samples  {}\n", s.num_samples);
  fmt::print("shards   {} ({})\n", s.num_shards, stoker::FormatBytes(s.shard_bytes));
  fmt::print("fields\n");
  for (const auto& f : s.fields)
    fmt::print("  {:<16} {:>10} samples  {:>10}\n", f.name, f.samples, stoker::FormatBytes(f.bytes));
  if (s.label_counts.empty()) {
    fmt::print("labels   none\n");
  } else {
    std::uint64_t lo = UINT64_MAX, hi = 0;
    for (const auto& [label, count] : s.label_counts) {
      lo = std::min(lo, count);
      hi = std::max(hi, count);
    }
    fmt::print("labels   {} classes, {}..{} samples per class, {} unlabelled\n", s.label_counts.size(), lo, hi,
               s.unlabelled);
    std::size_t shown = 0;
    for (const auto& [label, count] : s.label_counts) {
      if (shown++ == 20) {
        fmt::print("  ... ({} more; --json lists all)\n", s.label_counts.size() - 20);
        break;
      }
      fmt::print("  {:>6}: {:>8} {}\n", label, count, std::string(std::max<std::uint64_t>(1, count * 40 / hi), '#'));
    }
  }
  return kExitOk;
}

int RunVerify(const std::string& path, bool json) {
  auto dataset = OpenForCli(path);
  if (!dataset.ok()) return Fail(dataset.error());
  std::optional<stoker::ProgressBar> bar;
  stoker::VerifyOptions options;
  options.on_progress = [&](std::uint64_t shards, std::uint64_t bytes) {
    if (!bar) bar.emplace("verify", "shards", (*dataset)->shards().size());
    bar->Update(shards, bytes);
  };
  auto report = stoker::Verify(**dataset, options);
  if (bar) bar->Finish();
  if (!report.ok()) return Fail(report.error());
  if (json) {
    nlohmann::json out;
    out["ok"] = report->ok();
    out["samples_checked"] = report->samples_checked;
    out["shards_checked"] = report->shards_checked;
    out["bytes_checked"] = report->bytes_checked;
    out["problems"] = nlohmann::json::array();
    for (const auto& p : report->problems)
      out["problems"].push_back({{"where", p.where}, {"key", p.key}, {"message", p.message}});
    fmt::print("{}\n", out.dump(2));
  } else {
    for (const auto& p : report->problems) {
      if (p.key.empty())
        fmt::print(stderr, "CORRUPT {}: {}\n", p.where, p.message);
      else
        fmt::print(stderr, "CORRUPT {} sample '{}': {}\n", p.where, p.key, p.message);
    }
    fmt::print("{}: checked {} samples in {} shards ({}): {}\n", (*dataset)->index_path(), report->samples_checked,
               report->shards_checked, stoker::FormatBytes(report->bytes_checked),
               report->ok() ? "OK" : fmt::format("{} problems", report->problems.size()));
  }
  return report->ok() ? kExitOk : kExitError;
}

// One line per sample: key, shard:offset, label, fields (or JSON Lines).
int RunList(const std::string& path, bool json) {
  auto dataset = OpenForCli(path);
  if (!dataset.ok()) return Fail(dataset.error());
  const auto& d = **dataset;
  for (std::uint64_t i = 0; i < d.num_samples(); ++i) {
    auto info = d.Sample(i);
    if (!info.ok()) return Fail(info.error());
    std::vector<std::string> fields;
    std::uint64_t first = UINT64_MAX;
    nlohmann::json field_json = nlohmann::json::object();
    for (std::size_t f = 0; f < info->fields.size(); ++f) {
      if (!info->fields[f]) continue;
      fields.push_back(d.field_names()[f]);
      first = std::min(first, info->fields[f]->offset);
      field_json[d.field_names()[f]] = {{"offset", info->fields[f]->offset}, {"size", info->fields[f]->size}};
    }
    const std::string& shard = d.shards()[info->shard].path;
    if (json) {
      nlohmann::json line = {{"index", i}, {"key", info->key}, {"shard", shard}, {"fields", field_json}};
      line["label"] = info->label == stoker::kNoLabel ? nlohmann::json() : nlohmann::json(info->label);
      fmt::print("{}\n", line.dump());
    } else {
      std::string label = info->label == stoker::kNoLabel ? "-" : std::to_string(info->label);
      fmt::print("{}\t{}:{}\t{}\t{}\n", info->key, shard, first, label, fmt::join(fields, ","));
    }
  }
  return kExitOk;
}

struct BenchArgs {
  std::string dataset;
  std::uint32_t batch_size = 64, threads = 0, prefetch = 0, shard_window = 0;
  std::uint64_t epochs = 1, max_batches = 0, seed = 0;
  double consumer_ms = 0;
  std::string dtype = "float32", order = "shuffle", on_corrupt = "error";
  int size = 224;
  bool eval = false, json = false;
};

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

// Runs the loader over the dataset and reports throughput, consumer wait,
// CPU cost and memory; with --consumer-ms, a simulated accelerator step per
// batch and the resulting accelerator utilisation (time computing / wall time,
// as MLPerf Storage defines AU).
int RunBench(const BenchArgs& a) {
  auto opened = OpenForCli(a.dataset);
  if (!opened.ok() && opened.error().code() == stoker::StatusCode::kNotFound && !stoker::IsRemoteLocation(a.dataset)) {
    // A folder without an index: read it as an ImageFolder of loose files.
    auto loose = stoker::Dataset::OpenImageFolder(a.dataset);
    if (loose.ok()) {
      fmt::print(stderr,
                 "stoker: note: '{}' has no {}; reading it as an ImageFolder of loose files ({} samples; "
                 "`stoker pack` makes it faster)\n",
                 a.dataset, stoker::kIndexFileName, (*loose)->num_samples());
      opened = std::move(loose);
    }
  }
  if (!opened.ok()) return Fail(opened.error());
  std::shared_ptr<const stoker::Dataset> dataset = std::move(opened).value();
  const bool remote = stoker::IsRemoteLocation(a.dataset);
  std::uint64_t dataset_bytes = 0;
  for (const auto& shard : dataset->shards()) dataset_bytes += shard.size;
  stoker::LoaderOptions o;
  o.batch_size = a.batch_size;
  o.threads = a.threads;
  o.prefetch = a.prefetch;
  o.seed = a.seed;
  o.shuffle = a.order != "sequential";
  o.order = a.order == "shard-block" ? stoker::Order::kShardBlockShuffle : stoker::Order::kShuffle;
  o.shard_window = a.shard_window;
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
  if (!a.json)
    fmt::print("bench {}: {} samples, batch {}, {} threads, prefetch {}, {}{}, {} {}x{}{}\n", dataset->index_path(),
               dataset->num_samples(), a.batch_size, l.stats().threads, l.stats().prefetch, a.order,
               a.order == "shard-block" ? fmt::format(" (window {} shards)", l.stats().shard_window) : "", a.dtype,
               a.size, a.size, a.consumer_ms > 0 ? fmt::format(", simulated step {} ms", a.consumer_ms) : "");
  if (!a.json) {
    fmt::print("batch buffers: {}\n", l.stats().pinned_memory ? "page-locked (CUDA)"
                                                              : fmt::format("page-aligned, not page-locked: {}",
                                                                            stoker::CudaRuntime::Get().reason()));
  }
  for (std::uint64_t e = 0; e < a.epochs; ++e) {
    const auto before = l.stats();
    const auto remote_before = stoker::GetRemoteStats(*dataset);
    const double cpu0 = CpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t batches = 0, images = 0;
    double compute_s = 0;
    while (true) {
      auto next = l.Next();
      if (!next.ok()) return Fail(next.error());
      if (!next->has_value()) break;
      images += (*next)->size();
      ++batches;
      if (a.consumer_ms > 0) {
        const auto step_start = std::chrono::steady_clock::now();
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(a.consumer_ms));
        compute_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
      }
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
                          {"shard_window", after.shard_window},
                          {"corrupt_skipped", epoch_stats.corrupt_skipped},
                          {"read_s", epoch_stats.read_seconds},
                          {"decode_s", epoch_stats.decode_seconds},
                          {"transform_s", epoch_stats.transform_seconds},
                          {"read_requests", epoch_stats.read_requests},
                          {"read_method", after.read_method}};
      if (remote) {
        j["bytes_downloaded"] = downloaded;
        j["read_amplification"] = amplification;
        j["cache_hit_rate"] = hit_rate;
        j["cache_wait_s"] = remote_after.wait_seconds - remote_before.wait_seconds;
        j["download_retries"] = remote_after.retries - remote_before.retries;
        j["cache_evictions"] = remote_after.evictions - remote_before.evictions;
        j["connections_opened"] = remote_after.connections - remote_before.connections;
      }
      if (a.consumer_ms > 0) {
        j["consumer_ms"] = a.consumer_ms;
        j["accelerator_utilization"] = compute_s / wall;
        j["idle_percent"] = 100.0 * (1.0 - compute_s / wall);
      }
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
      if (a.consumer_ms > 0)
        fmt::print(", accelerator utilization {:.1f}% (idle {:.1f}%)", 100.0 * compute_s / wall,
                   100.0 * (1.0 - compute_s / wall));
      fmt::print("\n");
    }
  }
  return kExitOk;
}

void PrintCacheStat(const stoker::CacheStat& st, bool json) {
  if (json) {
    nlohmann::json j = {{"dir", st.dir},
                        {"entries", st.entries},
                        {"bytes", st.bytes},
                        {"partial_files", st.partial_files},
                        {"partial_bytes", st.partial_bytes},
                        {"free_bytes", st.free_bytes}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("cache {}: {} shards, {}; {} partial downloads ({}); {} free on its file system\n", st.dir, st.entries,
             stoker::FormatBytes(st.bytes), st.partial_files, stoker::FormatBytes(st.partial_bytes),
             stoker::FormatBytes(st.free_bytes));
}

int RunCacheStatOrClear(bool clear, bool json) {
  auto options = RemoteOptionsFromArgs();
  if (!options.ok()) return Fail(options.error());
  auto st = clear ? stoker::ClearCache(options->cache) : stoker::StatCache(options->cache);
  if (!st.ok()) return Fail(st.error());
  PrintCacheStat(*st, json);
  return kExitOk;
}

int RunCacheWarm(const std::string& location, bool json) {
  if (!stoker::IsRemoteLocation(location))
    return Fail(
        Status::InvalidArgument(fmt::format("{}: not a remote location (http://, https:// or s3://)", location)));
  auto dataset = OpenForCli(location);
  if (!dataset.ok()) return Fail(dataset.error());
  stoker::ProgressBar progress("warm", "shards", (*dataset)->shards().size());
  Status s = stoker::WarmCache(**dataset, [&](std::uint64_t done, std::uint64_t) { progress.Update(done, 0); });
  progress.Finish();
  if (!s.ok()) return Fail(s);
  auto options = RemoteOptionsFromArgs();
  if (!options.ok()) return Fail(options.error());
  auto st = stoker::StatCache(options->cache);
  if (!st.ok()) return Fail(st.error());
  PrintCacheStat(*st, json);
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stoker: keep deep-learning GPUs busy. Packs small files into indexed WebDataset shards."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "stoker 0.1.0");

  std::string source, out, shard_size = "64MiB", index_output, dataset;
  unsigned threads = 0;
  bool force = false, json = false;
  std::vector<std::string> shards;

  auto* pack =
      app.add_subcommand("pack", "Pack an ImageFolder tree, a CSV/JSONL manifest or tar shards into indexed shards");
  pack->add_option("SRC", source,
                   "ImageFolder directory, manifest (.csv/.jsonl) or shards (.tar, brace patterns allowed)")
      ->required();
  pack->add_option("OUT", out, "Output folder for shard-NNNNNN.tar and index.stoker")->required();
  pack->add_option("--shard-size", shard_size, "Target shard size, e.g. 64MiB, 1GB")->capture_default_str();
  pack->add_option("--threads", threads, "Reader threads (default: automatic)");
  pack->add_flag("--force", force, "Replace a dataset already in OUT");

  auto* index = app.add_subcommand("index", "Build the index for existing WebDataset shards");
  index->add_option("SHARDS", shards, "Shard files or brace patterns such as data-{000000..000099}.tar")->required();
  index->add_option("-o,--output", index_output, "Index file to write (default: index.stoker beside the first shard)");
  index->add_flag("--force", force, "Replace an existing index");

  auto* inspect = app.add_subcommand("inspect", "Summarise a dataset: samples, shards, fields, bytes, labels");
  inspect->add_option("DATASET", dataset, "Dataset folder or index file")->required();
  inspect->add_flag("--json", json, "Print a machine-readable summary");

  auto* verify = app.add_subcommand("verify", "Check every checksum; name each corrupt sample");
  verify->add_option("DATASET", dataset, "Dataset folder or index file")->required();
  verify->add_flag("--json", json, "Print the report as JSON");

  auto* list = app.add_subcommand("ls", "List every sample: key, shard:offset, label, fields");
  list->add_option("DATASET", dataset, "Dataset folder or index file")->required();
  list->add_flag("--json", json, "One JSON object per sample (JSON Lines)");

  BenchArgs bench_args;
  auto* bench = app.add_subcommand("bench", "Run the loader over a dataset and report images/s, wait, CPU and memory");
  bench->add_option("DATASET", bench_args.dataset, "Dataset folder or index file")->required();
  bench->add_option("--batch-size", bench_args.batch_size, "Images per batch")->capture_default_str();
  bench->add_option("--threads", bench_args.threads, "Worker threads (default: one per core)");
  bench->add_option("--prefetch", bench_args.prefetch, "Batches prepared ahead (default: automatic)");
  bench->add_option("--epochs", bench_args.epochs, "Epochs to run, each reported separately")->capture_default_str();
  bench->add_option("--max-batches", bench_args.max_batches, "Stop each epoch after this many batches");
  bench->add_option("--consumer-ms", bench_args.consumer_ms, "Simulated accelerator step per batch, in ms");
  bench->add_option("--dtype", bench_args.dtype, "float32, float16, bfloat16 or uint8 (NHWC)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16", "uint8"}));
  bench->add_option("--size", bench_args.size, "Output image size")->capture_default_str();
  bench->add_option("--order", bench_args.order, "shuffle, shard-block or sequential")
      ->capture_default_str()
      ->check(CLI::IsMember({"shuffle", "shard-block", "sequential"}));
  bench->add_option("--shard-window", bench_args.shard_window,
                    "Shards per window for --order shard-block (default: 8, or for a remote dataset as many as the "
                    "cache holds twice over)");
  bench->add_option("--seed", bench_args.seed, "Shuffle and augmentation seed")->capture_default_str();
  bench->add_option("--on-corrupt", bench_args.on_corrupt, "error or skip")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "skip"}));
  bench->add_flag("--eval", bench_args.eval,
                  "Evaluation transform: Resize + CenterCrop (default: RandomResizedCrop + flip)");
  bench->add_flag("--json", bench_args.json, "One JSON object per epoch");

  AddRemoteOptions(inspect);
  AddRemoteOptions(verify);
  AddRemoteOptions(list);
  AddRemoteOptions(bench);
  auto* cache = app.add_subcommand("cache", "The local cache of remote datasets");
  cache->require_subcommand(1);
  auto* cache_stat = cache->add_subcommand("stat", "What the cache holds");
  auto* cache_clear = cache->add_subcommand("clear", "Remove every cached shard no process is downloading");
  auto* cache_warm = cache->add_subcommand("warm", "Download a remote dataset's shards (as many as fit)");
  cache_warm->add_option("DATASET", dataset, "URL of a remote dataset (http, https, s3)")->required();
  for (auto* c : {cache_stat, cache_clear, cache_warm}) {
    AddRemoteOptions(c);
    c->add_flag("--json", json, "Print JSON");
  }

  std::string checkpoint_path;
  auto* checkpoint = app.add_subcommand("checkpoint", "Inspect checkpoints written by stoker.Checkpointer");
  checkpoint->require_subcommand(1);
  auto* checkpoint_ls = checkpoint->add_subcommand("ls", "List published checkpoints, oldest first");
  checkpoint_ls->add_option("DIR", checkpoint_path, "Checkpoint directory")->required();
  checkpoint_ls->add_flag("--json", json, "One JSON object per checkpoint");
  auto* checkpoint_verify = checkpoint->add_subcommand(
      "verify", "Check every file's checksum and the safetensors rules; name what is corrupt");
  checkpoint_verify->add_option("PATH", checkpoint_path, "A step-N folder, or a directory of them")->required();
  checkpoint_verify->add_flag("--json", json, "One JSON object per checkpoint");

  CLI11_PARSE(app, argc, argv);
  if (checkpoint_ls->parsed()) return stoker_cli::RunCheckpointList(checkpoint_path, json);
  if (checkpoint_verify->parsed()) return stoker_cli::RunCheckpointVerify(checkpoint_path, json);
  if (bench->parsed()) return RunBench(bench_args);
  if (cache_stat->parsed() || cache_clear->parsed()) return RunCacheStatOrClear(cache_clear->parsed(), json);
  if (cache_warm->parsed()) return RunCacheWarm(dataset, json);
  if (pack->parsed()) return RunPack(source, out, shard_size, threads, force);
  if (index->parsed()) return RunIndex(shards, index_output, force);
  if (inspect->parsed()) return RunInspect(dataset, json);
  if (verify->parsed()) return RunVerify(dataset, json);
  if (list->parsed()) return RunList(dataset, json);
  return kExitError;
}
