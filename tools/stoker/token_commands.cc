// `stoker inspect PREFIX` and `stoker verify PREFIX` for Megatron token
// datasets (PREFIX.idx + PREFIX.bin): what one holds, and whether every
// token is an id the model can embed.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "stoker/progress.h"
#include "stoker/text.h"
#include "stoker/token_check.h"

namespace stoker_cli {
namespace {

bool IsTokenUrl(const std::string& s) {
  return s.starts_with("http://") || s.starts_with("https://") || s.starts_with("s3://");
}

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
  if (!IsTokenUrl(location) || open_error.ok() || open_error.code() != stoker::StatusCode::kNotFound)
    return std::nullopt;
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

int RunVerifyTokens(const std::string& prefix, const RemoteArgs& remote, bool json, std::uint64_t vocab_size) {
  auto dataset = OpenTokens(prefix, remote);
  if (!dataset.ok()) return Fail(dataset.error());
  std::optional<stoker::ProgressBar> bar;
  stoker::TokenCheckOptions options;
  options.vocab_size = vocab_size;
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
    out["problems_total"] = r.problems_total;
    out["problems"] = nlohmann::json::array();
    for (const auto& p : r.problems)
      out["problems"].push_back(
          {{"document", p.document}, {"position", p.position}, {"token", p.token}, {"message", p.message}});
    fmt::print("{}\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return r.ok() ? kExitOk : kExitError;
  }
  for (const auto& p : r.problems) fmt::print(stderr, "BAD TOKEN {}: {}\n", stoker::Printable(prefix), p.message);
  if (r.problems_total > r.problems.size())
    fmt::print(stderr, "... and {} more\n", r.problems_total - r.problems.size());
  const std::string ids =
      r.tokens_checked ? fmt::format("; ids {} to {} (a vocabulary of at least {} tokens{})", r.min_token, r.max_token,
                                     r.max_token + 1, vocab_size ? fmt::format(", --vocab-size {}", vocab_size) : "")
                       : "";
  fmt::print("{}: checked {} documents, {} tokens{}: {}\n", stoker::Printable(prefix), r.documents_checked,
             r.tokens_checked, ids, r.ok() ? "OK" : fmt::format("{} problems", r.problems_total));
  return r.ok() ? kExitOk : kExitError;
}

}  // namespace stoker_cli
