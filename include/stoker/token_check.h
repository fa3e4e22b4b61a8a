// stoker/token_check.h: looking at a Megatron token dataset as a whole
// (`stoker inspect PREFIX`, `stoker verify PREFIX`): what it holds, and
// whether every token is an id the model can embed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "stoker/status.h"
#include "stoker/tokens.h"

namespace stoker {

// What a token dataset holds, from its index alone (nothing read from the .bin).
struct TokenDatasetSummary {
  std::uint64_t documents = 0, empty_documents = 0, tokens = 0, bin_bytes = 0;
  std::string token_type;
  // Tokens per document (of all documents, empty ones included); zeros without documents.
  std::uint64_t min_tokens = 0, median_tokens = 0, p99_tokens = 0, max_tokens = 0;
  double mean_tokens = 0;
};
[[nodiscard]] TokenDatasetSummary SummarizeTokens(const TokenDataset& dataset);

// Whether `location` names a local Megatron token dataset: PREFIX with
// PREFIX.idx beginning with Megatron's magic, or PREFIX.idx / PREFIX.bin
// themselves. Returns PREFIX. A URL ending in .idx or .bin gives its
// prefix unchecked (the check would fetch it).
[[nodiscard]] std::optional<std::string> TokenDatasetPrefix(const std::string& location);

struct TokenCheckOptions {
  // Token ids at or above it are problems (0: only negative ids are).
  std::uint64_t vocab_size = 0;
  // The end-of-document token every document must end with (tokenize
  // appends it; Megatron's preprocess_data.py with --append-eod): a
  // document ending otherwise, or empty, is a problem. A corpus without it
  // trains a model that never learns where a text ends.
  std::optional<std::int64_t> eos;
  // Problems listed (each names document and position); the rest are counted.
  std::uint64_t max_problems = 100;
  // Called now and then with (documents done, tokens done); may be empty.
  std::function<void(std::uint64_t, std::uint64_t)> on_progress;
};

struct TokenProblem {
  std::uint64_t document = 0, position = 0;
  std::int64_t token = 0;
  std::string message;
};

struct TokenCheckReport {
  std::uint64_t documents_checked = 0, tokens_checked = 0;
  // The smallest and largest token id read (0 and 0 without tokens): the
  // largest + 1 is the least vocabulary the dataset needs.
  std::int64_t min_token = 0, max_token = 0;
  std::uint64_t problems_total = 0;
  std::vector<TokenProblem> problems;  // the first max_problems
  [[nodiscard]] bool ok() const { return problems_total == 0; }
};

// Reads every token of every document (the index's checks ran at open):
// a negative id, an id at or above `vocab_size`, a float token that is not
// a whole number, and with `eos` a document that does not end with it, are
// problems naming the document and position. A non-OK Status only when
// reading itself fails.
[[nodiscard]] Result<TokenCheckReport> CheckTokens(const TokenDataset& dataset, const TokenCheckOptions& options = {});

}  // namespace stoker
