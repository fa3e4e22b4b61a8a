// Megatron-LM's indexed token datasets (`PREFIX.idx` + `PREFIX.bin`), as
// Megatron-core, NeMo, GPT-NeoX and OLMo write them: bit-compatible reading
// and writing. Layout in docs/format.md. Pure functions over bytes.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::megatron {

// The .idx's first 9 bytes.
inline constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr std::uint64_t kVersion = 1;
// Magic, version (u64), token type code (u8), sequence count (u64), document-boundary count (u64).
inline constexpr std::size_t kHeaderSize = 9 + 8 + 1 + 8 + 8;

// The .bin's element type, by Megatron's codes.
enum class TokenType : std::uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};
[[nodiscard]] std::optional<TokenType> TokenTypeFromCode(std::uint8_t code);
[[nodiscard]] std::size_t TokenSize(TokenType type);
[[nodiscard]] std::string_view TokenTypeName(TokenType type);  // NumPy's: "uint16", "int32", ...
// Megatron's choice for a vocabulary: uint16 below 65500 tokens, else int32.
[[nodiscard]] TokenType TokenTypeForVocabulary(std::uint64_t vocab_size);

// A validated view of an .idx held in memory (mapped). A document is a run
// of sequences [boundary(d), boundary(d + 1)); a sequence is `length(i)`
// tokens at byte `pointer(i)` of the .bin.
class IndexView {
 public:
  // Checks the header, the counts against the file's size (with or without
  // the optional per-sequence modes), and every sequence and boundary
  // against `bin_size` (bytes of the .bin): lengths not negative, each
  // sequence inside the .bin, boundaries from 0 to the sequence count and
  // never decreasing. O(sequences + documents): a few tens of milliseconds
  // for ten million. `where` names the .idx in errors, each with its byte
  // offset there.
  [[nodiscard]] static Result<IndexView> Open(std::span<const std::byte> idx, std::string where,
                                              std::uint64_t bin_size);

  [[nodiscard]] TokenType token_type() const { return type_; }
  [[nodiscard]] std::uint64_t num_sequences() const { return sequences_; }
  [[nodiscard]] std::uint64_t num_documents() const { return boundaries_ == 0 ? 0 : boundaries_ - 1; }
  [[nodiscard]] bool has_modes() const { return has_modes_; }
  [[nodiscard]] std::int32_t length(std::uint64_t sequence) const { return Load<std::int32_t>(lengths_, sequence); }
  [[nodiscard]] std::int64_t pointer(std::uint64_t sequence) const { return Load<std::int64_t>(pointers_, sequence); }
  [[nodiscard]] std::int64_t boundary(std::uint64_t i) const { return Load<std::int64_t>(boundaries_at_, i); }
  [[nodiscard]] std::uint64_t total_tokens() const { return total_tokens_; }
  [[nodiscard]] const std::string& where() const { return where_; }

 private:
  // The arrays start at offset 34: not aligned, so read through memcpy.
  template <typename T>
  static T Load(const std::byte* base, std::uint64_t i) {
    T v;
    std::memcpy(&v, base + i * sizeof(T), sizeof(T));
    return v;
  }
  std::string where_;
  TokenType type_ = TokenType::kUInt16;
  std::uint64_t sequences_ = 0;
  std::uint64_t boundaries_ = 0;
  bool has_modes_ = false;
  std::uint64_t total_tokens_ = 0;
  const std::byte* lengths_ = nullptr;
  const std::byte* pointers_ = nullptr;
  const std::byte* boundaries_at_ = nullptr;
};

// Builds an .idx for documents whose tokens were appended to the .bin one
// after another, as Megatron's IndexedDatasetBuilder writes it (one
// sequence per document, no modes). Byte-identical to Megatron-core's
// output for the same documents and token type.
class IndexBuilder {
 public:
  explicit IndexBuilder(TokenType type) : type_(type) {}
  // A document of `tokens` tokens (after the previous one's in the .bin).
  [[nodiscard]] Status AddDocument(std::uint64_t tokens);
  [[nodiscard]] std::uint64_t num_documents() const { return lengths_.size(); }
  [[nodiscard]] std::vector<std::byte> Finish() const;

 private:
  TokenType type_;
  std::vector<std::int32_t> lengths_;
};

}  // namespace stoker::megatron
