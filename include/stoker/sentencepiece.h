// stoker/sentencepiece.h: a SentencePiece model (Debian's libsentencepiece)
// encoding batches of documents on several threads, for tokenize.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker {

class SentencePieceEncoder {
 public:
  // Loads a SentencePiece `.model` file. NotFound when it is missing;
  // InvalidArgument when it is not a model; Unimplemented when stoker was
  // built without libsentencepiece.
  [[nodiscard]] static Result<std::unique_ptr<SentencePieceEncoder>> Open(const std::string& model_path);
  ~SentencePieceEncoder();
  SentencePieceEncoder(const SentencePieceEncoder&) = delete;
  SentencePieceEncoder& operator=(const SentencePieceEncoder&) = delete;

  [[nodiscard]] std::uint32_t vocab_size() const;
  // The id of `piece`, nullopt when the model does not have it.
  [[nodiscard]] std::optional<std::int32_t> PieceId(std::string_view piece) const;
  // The model's end-of-sentence id, nullopt when it has none.
  [[nodiscard]] std::optional<std::int32_t> eos_id() const;
  // Encodes each text (UTF-8) into ids, no BOS or EOS added, on up to
  // `threads` threads (0: every core). Thread-safe. Errors name the text's
  // place in the batch.
  [[nodiscard]] Result<std::vector<std::vector<std::int32_t>>> EncodeBatch(std::span<const std::string_view> texts,
                                                                           unsigned threads = 0) const;

  struct Impl;

 private:
  explicit SentencePieceEncoder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker
