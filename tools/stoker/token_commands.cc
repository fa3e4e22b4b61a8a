// `stoker inspect|verify|bench PREFIX` for Megatron token datasets
// (PREFIX.idx + PREFIX.bin): what one holds, whether every token is an id
// the model can embed, and how fast stoker.TokenLoader reads it.
#include <algorithm>
#include <chrono>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "simulated_step.h"
#include "stoker/byte_size.h"
#include "stoker/progress.h"
#include "stoker/remote.h"
#include "stoker/text.h"
#include "stoker/token_check.h"

namespace stoker_cli {
namespace {

stoker::Result<std::unique_ptr<stoker::TokenDataset>> OpenTokens(const std::string& prefix, const RemoteArgs& remote) {
  STOKER_ASSIGN_OR_RETURN(auto options, OpenOptionsFrom(remote));
  stoker::TokenDatasetOptions where;
  where.remote = options.remote;
  return stoker::TokenDataset::Open(prefix, where);
}

}  // namespace

std::optional<std::string> TokenPrefixFor(const std::string& location, const stoker::Status& open_error,
                                          const RemoteArgs& remote) {
  if (auto prefix = stoker::TokenDatasetPrefix(location)) return prefix;
  // A URL prefix cannot be told by its name: one that is no stoker dataset may be a token dataset.
  if (!stoker::IsRemoteLocation(location) || open_error.code() != stoker::StatusCode::kNotFound) return std::nullopt;
  if (!OpenTokens(location, remote).ok()) return std::nullopt;
  return location;
}

int RunInspectTokens(const std::string& prefix, const RemoteArgs& remote, bool json, std::uint64_t seq_len) {
  auto dataset = OpenTokens(prefix, remote);
  if (!dataset.ok()) return Fail(dataset.error());
  const stoker::TokenDatasetSummary s = stoker::SummarizeTokens(**dataset);
  const std::uint64_t rows = seq_len ? (s.tokens + seq_len - 1) / seq_len : 0;
  if (json) {
    nlohmann::json out;
    out["format"] = "megatron";
    out["prefix"] = prefix;
    out["token_type"] = s.token_type;
    out["documents"] = s.documents;
    out["empty_documents"] = s.empty_documents;
    out["tokens"] = s.tokens;
    out["bin_bytes"] = s.bin_bytes;
    out["tokens_per_document"] = {{"min", s.min_tokens},
                                  {"median", s.median_tokens},
                                  {"mean", s.mean_tokens},
                                  {"p99", s.p99_tokens},
                                  {"max", s.max_tokens}};
    out["seq_len"] = seq_len;
    out["rows"] = rows;
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return kExitOk;
  }
  fmt::print("dataset    {} (Megatron token dataset: {}.idx + {}.bin)\n", stoker::Printable(prefix),
             stoker::Printable(prefix), stoker::Printable(prefix));
  fmt::print("documents  {}{}\n", s.documents, s.empty_documents ? fmt::format(" ({} empty)", s.empty_documents) : "");
  fmt::print("tokens     {} of {} ({})\n", s.tokens, s.token_type, stoker::FormatBytes(s.bin_bytes));
  if (s.documents)
    fmt::print("per doc    min {}, median {}, mean {:.1f}, p99 {}, max {} tokens\n", s.min_tokens, s.median_tokens,
               s.mean_tokens, s.p99_tokens, s.max_tokens);
  if (seq_len)
    fmt::print("rows       {} of {} tokens an epoch (stoker.TokenLoader(seq_len={}); --seq-len to change)\n", rows,
               seq_len, seq_len);
  return kExitOk;
}

int RunVerifyTokens(const std::string& prefix, const RemoteArgs& remote, bool json, const TokenVerifyArgs& args) {
  const std::uint64_t vocab_size = args.vocab_size;
  auto dataset = OpenTokens(prefix, remote);
  if (!dataset.ok()) return Fail(dataset.error());
  std::optional<stoker::ProgressBar> bar;
  stoker::TokenCheckOptions options;
  options.vocab_size = vocab_size;
  options.eos = args.eos;
  options.max_problems = json ? 100 : 20;  // a wrong vocabulary makes millions: the first name it
  options.on_progress = [&](std::uint64_t documents, std::uint64_t tokens) {
    if (!bar) bar.emplace("verify", "documents", (*dataset)->num_documents());
    bar->Update(documents,
                tokens * ((*dataset)->num_tokens() ? (*dataset)->bin_bytes() / (*dataset)->num_tokens() : 0));
  };
  auto report = stoker::CheckTokens(**dataset, options);
  if (bar) bar->Finish();
  if (!report.ok()) return Fail(report.error());
  const auto& r = *report;
  if (json) {
    nlohmann::json out;
    out["ok"] = r.ok();
    out["documents_checked"] = r.documents_checked;
    out["tokens_checked"] = r.tokens_checked;
    out["min_token"] = r.min_token;
    out["max_token"] = r.max_token;
    out["vocab_size"] = vocab_size ? nlohmann::json(vocab_size) : nlohmann::json();
    out["eos"] = args.eos ? nlohmann::json(*args.eos) : nlohmann::json();
    out["problems_total"] = r.problems_total;
    out["problems"] = nlohmann::json::array();
    for (const auto& p : r.problems)
      out["problems"].push_back(
          {{"document", p.document}, {"position", p.position}, {"token", p.token}, {"message", p.message}});
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return r.ok() ? kExitOk : kExitError;
  }
  for (const auto& p : r.problems) fmt::print(stderr, "PROBLEM {}: {}\n", stoker::Printable(prefix), p.message);
  if (r.problems_total > r.problems.size())
    fmt::print(stderr, "... and {} more\n", r.problems_total - r.problems.size());
  const std::string ids =
      r.tokens_checked ? fmt::format("; ids {} to {} (a vocabulary of at least {} tokens{})", r.min_token, r.max_token,
                                     r.max_token + 1, vocab_size ? fmt::format(", --vocab-size {}", vocab_size) : "")
                       : "";
  const std::string ends = args.eos ? fmt::format("; each document to end with {}", *args.eos) : "";
  fmt::print("{}: checked {}, {}{}{}: {}\n", stoker::Printable(prefix),
             stoker::Counted(r.documents_checked, "document", "documents"),
             stoker::Counted(r.tokens_checked, "token", "tokens"), ids, ends,
             r.ok() ? "OK" : stoker::Counted(r.problems_total, "problem", "problems"));
  return r.ok() ? kExitOk : kExitError;
}

// stoker.TokenLoader's native loader over the dataset, measured per epoch:
// tokens/s, batches/s, the consumer's wait, the packing thread's time, CPU
// and memory; with --consumer-ms a simulated accelerator step.
int RunBenchTokens(const std::string& prefix, const BenchArgs& a) {
  if (!a.image_options_given.empty())
    return Fail(stoker::Status::InvalidArgument(
        fmt::format("{} {} for images; a token dataset takes --seq-len, --batch-size (rows), --prefetch, --epochs, "
                    "--max-batches, --consumer-ms, --order, --kernel-readahead, --seed and --json",
                    fmt::join(a.image_options_given, ", "), a.image_options_given.size() == 1 ? "is" : "are")));
  auto seed = ParseSeed(a.seed);
  if (!seed.ok()) return Fail(seed.error());
  if (auto valid = SimulatedStep::Check(a.consumer_ms); !valid.ok()) return Fail(valid);
  if (a.order == "shard-block")
    return Fail(
        stoker::Status::InvalidArgument("--order shard-block is for packed datasets: a token dataset reads "
                                        "rows in a shuffled order (auto, shuffle) or front to back "
                                        "(sequential)"));
  auto opened = OpenTokens(prefix, a.remote);
  if (!opened.ok()) return Fail(opened.error());
  std::shared_ptr<const stoker::TokenDataset> dataset = std::move(opened).value();
  stoker::TokenLoaderOptions o;
  o.seq_len = a.seq_len;
  o.global_batch_size = a.batch_size;
  o.seed = *seed;
  o.shuffle = a.order != "sequential";
  if (a.prefetch) o.prefetch = a.prefetch;
  o.kernel_readahead = a.kernel_readahead == "on"    ? stoker::KernelReadahead::kOn
                       : a.kernel_readahead == "off" ? stoker::KernelReadahead::kOff
                                                     : stoker::KernelReadahead::kAuto;
  auto made = stoker::TokenLoader::Create(dataset, o);
  if (!made.ok()) return Fail(made.error());
  stoker::TokenLoader& loader = **made;
  if (!a.json) {
    fmt::print("bench {}: {} documents, {} tokens of {}, {} rows of {} tokens, batch {} rows, prefetch {}, {}{}\n",
               stoker::Printable(prefix), dataset->num_documents(), dataset->num_tokens(), dataset->token_type(),
               loader.num_rows(), a.seq_len, a.batch_size, o.prefetch, o.shuffle ? "shuffled" : "sequential",
               a.consumer_ms > 0 ? fmt::format(", simulated step {} ms", a.consumer_ms) : "");
    fmt::print("{}\n", loader.readahead_note());
  }
  SimulatedStep step(a.consumer_ms);
  for (std::uint64_t e = 0; e < a.epochs; ++e) {
    const stoker::TokenLoaderStats before = loader.Stats();
    const stoker::RemoteStats remote_before = dataset->remote_stats();
    const double cpu0 = CpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    std::uint64_t batches = 0;
    step.StartEpoch();
    for (;;) {
      auto next = loader.Next();
      if (!next.ok()) return Fail(next.error());
      if (!next->has_value()) break;
      ++batches;
      step.Run();
      if (a.max_batches && batches >= a.max_batches) {
        if (auto status = loader.SetEpoch(e + 1); !status.ok()) return Fail(status);
        break;
      }
    }
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = CpuSeconds() - cpu0;
    const stoker::TokenLoaderStats after = loader.Stats();
    const stoker::RemoteStats remote_after = dataset->remote_stats();
    const std::uint64_t rows = after.rows - before.rows, tokens = after.tokens - before.tokens;
    const double waited = after.wait_seconds - before.wait_seconds, built = after.build_seconds - before.build_seconds;
    const double downloads_waited = remote_after.wait_seconds - remote_before.wait_seconds;
    if (a.json) {
      nlohmann::json j = {{"epoch", e},
                          {"batches", batches},
                          {"rows", rows},
                          {"tokens", tokens},
                          {"wall_s", wall},
                          {"tokens_per_s", tokens / wall},
                          {"batches_per_s", batches / wall},
                          {"consumer_wait_s", waited},
                          {"build_s", built},
                          {"cpu_s_per_batch", batches ? cpu / batches : 0.0},
                          {"peak_rss_bytes", PeakRssBytes()},
                          {"prefetch", o.prefetch},
                          {"kernel_readahead", loader.kernel_readahead()}};
      if (dataset->remote()) {
        j["bytes_downloaded"] = remote_after.bytes_downloaded - remote_before.bytes_downloaded;
        j["cache_wait_s"] = downloads_waited;
      }
      step.AddTo(j, wall);
      fmt::print("{}\n", j.dump());
      continue;
    }
    fmt::print(
        "epoch {}: {} batches, {} rows, {} tokens in {:.2f} s ({:.2f} M tokens/s, {:.0f} batches/s); consumer "
        "waited {:.2f} s ({:.1f}%); packing thread busy {:.0f}%{}\n",
        e, batches, rows, tokens, wall, tokens / wall / 1e6, batches / wall, waited, 100.0 * waited / wall,
        std::min(100.0, 100.0 * built / wall),
        dataset->remote()
            ? fmt::format("; downloaded {}, waited {:.2f} s for downloads",
                          stoker::FormatBytes(remote_after.bytes_downloaded - remote_before.bytes_downloaded),
                          downloads_waited)
            : "");
    fmt::print("epoch {}: {:.3f} ms CPU per batch, peak RSS {}", e, batches ? 1000.0 * cpu / batches : 0.0,
               stoker::FormatBytes(PeakRssBytes()));
    fmt::print("{}\n", step.Text(wall));
  }
  return kExitOk;
}

}  // namespace stoker_cli
