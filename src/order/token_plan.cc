#include "order/token_plan.h"

#include <algorithm>
#include <numeric>

#include "core/rng.h"

namespace stoker::order {
namespace {

// PRNG streams of their own, apart from the image sampler's.
constexpr std::uint64_t kDocumentStream = 0x746f6b2d646f6373;  // "tok-docs"
constexpr std::uint64_t kRowStream = 0x746f6b2d726f7773;       // "tok-rows"

}  // namespace

TokenEpochPlan::TokenEpochPlan(std::span<const std::uint64_t> document_tokens, std::uint64_t seq_len,
                               std::uint64_t seed, std::uint64_t epoch, bool shuffle)
    : seq_len_(std::max<std::uint64_t>(1, seq_len)), epoch_(epoch) {
  document_order_.resize(document_tokens.size());
  std::iota(document_order_.begin(), document_order_.end(), std::uint64_t{0});
  if (shuffle) {
    Rng rng(seed, SplitMix64(kDocumentStream ^ epoch));
    Shuffle(document_order_.data(), document_order_.size(), rng);
  }
  stream_end_.resize(document_order_.size());
  std::uint64_t tokens = 0;
  for (std::size_t i = 0; i < document_order_.size(); ++i) {
    tokens += document_tokens[document_order_[i]];
    stream_end_[i] = tokens;
  }
  rows_ = (tokens + seq_len_ - 1) / seq_len_;
  if (shuffle) {
    row_order_.resize(rows_);
    std::iota(row_order_.begin(), row_order_.end(), std::uint64_t{0});
    Rng rng(seed, SplitMix64(kRowStream ^ epoch));
    Shuffle(row_order_.data(), row_order_.size(), rng);
  }
}

void TokenEpochPlan::Row(std::uint64_t r, std::uint64_t extra, std::vector<TokenPiece>& out) const {
  const std::uint64_t total = total_tokens();
  std::uint64_t at = StreamRow(r) * seq_len_;
  const std::uint64_t end = std::min(total, at + seq_len_ + extra);
  // The first document whose tokens reach past `at` (empty documents are passed over).
  auto it = std::upper_bound(stream_end_.begin(), stream_end_.end(), at);
  while (at < end && it != stream_end_.end()) {
    const std::size_t position = static_cast<std::size_t>(it - stream_end_.begin());
    const std::uint64_t start = position == 0 ? 0 : stream_end_[position - 1];
    const std::uint64_t length = std::min(*it, end) - at;
    if (length > 0) out.push_back({document_order_[position], at - start, length});
    at += length;
    ++it;
  }
}

}  // namespace stoker::order
