#include <sentencepiece_processor.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include <fmt/format.h>

#include "stoker/sentencepiece.h"

namespace stoker {

struct SentencePieceEncoder::Impl {
  sentencepiece::SentencePieceProcessor processor;  // Encode is const and thread-safe
};

SentencePieceEncoder::SentencePieceEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceEncoder::~SentencePieceEncoder() = default;

Result<std::unique_ptr<SentencePieceEncoder>> SentencePieceEncoder::Open(const std::string& model_path) {
  auto impl = std::make_unique<Impl>();
  const auto status = impl->processor.Load(model_path);
  if (!status.ok()) {
    if (status.code() == sentencepiece::util::StatusCode::kNotFound)
      return Status::NotFound(fmt::format("{}: no such SentencePiece model ({})", model_path, status.ToString()));
    // SentencePiece's message here is its parser's source line, not news to a user.
    return Status::InvalidArgument(fmt::format("{}: not a SentencePiece model (it does not parse as one)", model_path));
  }
  return std::unique_ptr<SentencePieceEncoder>(new SentencePieceEncoder(std::move(impl)));
}

std::uint32_t SentencePieceEncoder::vocab_size() const {
  return static_cast<std::uint32_t>(impl_->processor.GetPieceSize());
}

std::optional<std::int32_t> SentencePieceEncoder::PieceId(std::string_view piece) const {
  const int id = impl_->processor.PieceToId(piece);
  // Unknown pieces map to the unknown token's id: only a round trip tells.
  if (id < 0 || impl_->processor.IdToPiece(id) != piece) return std::nullopt;
  return id;
}

std::optional<std::int32_t> SentencePieceEncoder::eos_id() const {
  const int id = impl_->processor.eos_id();
  if (id < 0) return std::nullopt;
  return id;
}

Result<std::vector<std::vector<std::int32_t>>> SentencePieceEncoder::EncodeBatch(
    std::span<const std::string_view> texts, unsigned threads) const {
  std::vector<std::vector<std::int32_t>> out(texts.size());
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  threads = static_cast<unsigned>(std::min<std::size_t>(threads, texts.size()));
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> failed{texts.size()};  // the first failing text's place
  std::string error;                              // written once, by the thread that sets error_taken
  std::atomic_flag error_taken;
  const auto work = [&] {
    std::vector<int> ids;
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < texts.size();) {
      const auto status = impl_->processor.Encode(texts[i], &ids);
      if (!status.ok()) {
        if (!error_taken.test_and_set()) {
          error = status.ToString();
          failed = i;
        }
        return;
      }
      out[i].assign(ids.begin(), ids.end());
    }
  };
  {
    std::vector<std::jthread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
  }
  if (failed < texts.size())
    return Status::InvalidArgument(
        fmt::format("text {} of the batch: SentencePiece cannot encode it ({})", failed.load(), error));
  return out;
}

}  // namespace stoker
