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

BlendPlan::BlendPlan(std::span<const std::uint64_t> rows, std::span<const double> weights)
    : dataset_rows_(rows.begin(), rows.end()), per_epoch_(rows.size(), 0) {
  // Datasets of weight 0 take no rows and add none to the blend epoch.
  std::uint64_t total = 0;
  double sum = 0;
  for (std::size_t d = 0; d < rows.size(); ++d)
    if (weights[d] > 0) {
      total += rows[d];
      sum += weights[d];
    }
  choice_.resize(total);
  within_.resize(total);
  for (std::uint64_t s = 0; s < total; ++s) {
    // The dataset furthest behind its share of the rows so far (the lowest index on a tie).
    std::size_t best = 0;
    double best_gap = -1e300;
    for (std::size_t d = 0; d < weights.size(); ++d) {
      if (weights[d] <= 0 || dataset_rows_[d] == 0) continue;
      const double gap = weights[d] / sum * static_cast<double>(s + 1) - static_cast<double>(per_epoch_[d]);
      if (gap > best_gap) {
        best_gap = gap;
        best = d;
      }
    }
    choice_[s] = static_cast<std::uint8_t>(best);
    within_[s] = per_epoch_[best]++;
  }
}

BlendPlan::Source BlendPlan::At(std::uint64_t epoch, std::uint64_t r) const {
  const std::uint32_t d = choice_[r];
  const std::uint64_t k = epoch * per_epoch_[d] + within_[r];
  return {d, k / dataset_rows_[d], k % dataset_rows_[d]};
}

}  // namespace stoker::order
