// SummarizeTokens, TokenDatasetPrefix and CheckTokens: a Megatron token
// dataset as a whole, for `stoker inspect` and `stoker verify`.
#include "stoker/token_check.h"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "remote/url.h"

namespace stoker {
namespace {

constexpr std::string_view kMagic{"MMIDIDX\0\0", 9};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

bool HasMegatronMagic(const std::string& idx) {
  std::ifstream in(idx, std::ios::binary);
  std::array<char, 9> head{};
  return in.read(head.data(), head.size()) && std::string_view(head.data(), head.size()) == kMagic;
}

}  // namespace

TokenDatasetSummary SummarizeTokens(const TokenDataset& dataset) {
  TokenDatasetSummary s;
  s.documents = dataset.num_documents();
  s.tokens = dataset.num_tokens();
  s.bin_bytes = dataset.bin_bytes();
  s.token_type = std::string(dataset.token_type());
  const auto counts = dataset.document_tokens();
  if (counts.empty()) return s;
  std::vector<std::uint64_t> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end());
  s.empty_documents = static_cast<std::uint64_t>(std::upper_bound(sorted.begin(), sorted.end(), 0) - sorted.begin());
  s.min_tokens = sorted.front();
  s.max_tokens = sorted.back();
  s.median_tokens = sorted[(sorted.size() - 1) / 2];
  s.p99_tokens = sorted[(sorted.size() - 1) * 99 / 100];
  s.mean_tokens = static_cast<double>(s.tokens) / static_cast<double>(s.documents);
  return s;
}

std::optional<std::string> TokenDatasetPrefix(const std::string& location) {
  std::string prefix = location;
  const bool named_file = EndsWith(location, ".idx") || EndsWith(location, ".bin");
  if (named_file) prefix.resize(prefix.size() - 4);
  if (remote::IsRemoteUrl(location)) return named_file ? std::optional(prefix) : std::nullopt;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(prefix + ".idx", ec)) return std::nullopt;
  if (!named_file && std::filesystem::exists(location, ec)) return std::nullopt;  // a dataset folder or file of its own
  if (!HasMegatronMagic(prefix + ".idx")) return std::nullopt;
  return prefix;
}

Result<TokenCheckReport> CheckTokens(const TokenDataset& dataset, const TokenCheckOptions& options) {
  TokenCheckReport report;
  const auto counts = dataset.document_tokens();
  const bool floats = dataset.token_type().starts_with("float");
  constexpr std::uint64_t kChunk = std::uint64_t{1} << 20;
  std::vector<std::int64_t> tokens;
  std::int64_t lowest = std::numeric_limits<std::int64_t>::max(), highest = std::numeric_limits<std::int64_t>::min();
  const auto problem = [&](std::uint64_t document, std::uint64_t position, std::int64_t token, std::string message) {
    ++report.problems_total;
    if (report.problems.size() < options.max_problems)
      report.problems.push_back({document, position, token, std::move(message)});
  };
  for (std::uint64_t d = 0; d < counts.size(); ++d) {
    std::optional<std::int64_t> last;  // the document's last token, once read
    for (std::uint64_t offset = 0; offset < counts[d]; offset += kChunk) {
      tokens.resize(std::min(kChunk, counts[d] - offset));
      Status read = dataset.ReadTokens(d, offset, tokens);
      if (!read.ok()) {
        // A float that is not a token id: a problem of this document; its other tokens are not read.
        if (!floats || read.code() != StatusCode::kCorruption) return read;
        problem(d, offset, 0, read.message());
        break;
      }
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        const std::int64_t t = tokens[i];
        lowest = std::min(lowest, t);
        highest = std::max(highest, t);
        if (t < 0)
          problem(d, offset + i, t,
                  fmt::format("document {} holds token {} at position {}: a negative id", d, t, offset + i));
        else if (options.vocab_size != 0 && static_cast<std::uint64_t>(t) >= options.vocab_size)
          problem(d, offset + i, t,
                  fmt::format("document {} holds token {} at position {}, outside the vocabulary (vocab_size {})", d, t,
                              offset + i, options.vocab_size));
      }
      report.tokens_checked += tokens.size();
      if (offset + tokens.size() == counts[d]) last = tokens.back();
    }
    if (options.eos && counts[d] == 0)
      problem(d, 0, 0, fmt::format("document {} is empty: it has no end-of-document token {}", d, *options.eos));
    else if (options.eos && last && *last != *options.eos)
      problem(d, counts[d] - 1, *last,
              fmt::format("document {} ends with token {}, not the end-of-document token {}", d, *last, *options.eos));
    ++report.documents_checked;
    if (options.on_progress && (d % 4096 == 4095 || d + 1 == counts.size()))
      options.on_progress(report.documents_checked, report.tokens_checked);
  }
  if (report.tokens_checked > 0) {
    report.min_token = lowest;
    report.max_token = highest;
  }
  return report;
}

}  // namespace stoker
