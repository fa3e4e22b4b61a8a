// SentencePieceEncoder where stoker was built without libsentencepiece.
#include "stoker/sentencepiece.h"

namespace stoker {

struct SentencePieceEncoder::Impl {};

SentencePieceEncoder::SentencePieceEncoder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SentencePieceEncoder::~SentencePieceEncoder() = default;

Result<std::unique_ptr<SentencePieceEncoder>> SentencePieceEncoder::Open(const std::string& model_path) {
  return Status::Unimplemented(model_path +
                               ": stoker was built without SentencePiece (install libsentencepiece-dev and rebuild)");
}
std::uint32_t SentencePieceEncoder::vocab_size() const {
  return 0;
}
std::optional<std::int32_t> SentencePieceEncoder::PieceId(std::string_view) const {
  return std::nullopt;
}
std::optional<std::int32_t> SentencePieceEncoder::eos_id() const {
  return std::nullopt;
}
Result<std::vector<std::vector<std::int32_t>>> SentencePieceEncoder::EncodeBatch(std::span<const std::string_view>,
                                                                                 unsigned) const {
  return Status::Unimplemented("stoker was built without SentencePiece");
}

}  // namespace stoker
