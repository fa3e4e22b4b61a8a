#include "format/megatron_index.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

namespace stoker::megatron {
namespace {

template <typename T>
T LoadAt(std::span<const std::byte> bytes, std::size_t offset) {
  T v;
  std::memcpy(&v, bytes.data() + offset, sizeof(T));
  return v;
}

template <typename T>
void Append(std::vector<std::byte>& out, T v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

}  // namespace

std::optional<TokenType> TokenTypeFromCode(std::uint8_t code) {
  if (code < 1 || code > 8) return std::nullopt;
  return static_cast<TokenType>(code);
}

std::size_t TokenSize(TokenType type) {
  switch (type) {
    case TokenType::kUInt8:
    case TokenType::kInt8:
      return 1;
    case TokenType::kInt16:
    case TokenType::kUInt16:
      return 2;
    case TokenType::kInt32:
    case TokenType::kFloat32:
      return 4;
    case TokenType::kInt64:
    case TokenType::kFloat64:
      return 8;
  }
  return 1;
}

std::string_view TokenTypeName(TokenType type) {
  switch (type) {
    case TokenType::kUInt8:
      return "uint8";
    case TokenType::kInt8:
      return "int8";
    case TokenType::kInt16:
      return "int16";
    case TokenType::kInt32:
      return "int32";
    case TokenType::kInt64:
      return "int64";
    case TokenType::kFloat64:
      return "float64";
    case TokenType::kFloat32:
      return "float32";
    case TokenType::kUInt16:
      return "uint16";
  }
  return "?";
}

TokenType TokenTypeForVocabulary(std::uint64_t vocab_size) {
  return vocab_size < 65500 ? TokenType::kUInt16 : TokenType::kInt32;
}

Result<IndexView> IndexView::Open(std::span<const std::byte> idx, std::string where, std::uint64_t bin_size) {
  auto corrupt = [&](std::uint64_t offset, std::string_view what) {
    return Status::Corruption(fmt::format("{}: not a valid Megatron index: {} (at byte {})", where, what, offset));
  };
  if (idx.size() < kHeaderSize)
    return corrupt(0, fmt::format("the file is {} bytes, shorter than the {}-byte header", idx.size(), kHeaderSize));
  if (std::memcmp(idx.data(), kMagic, sizeof(kMagic)) != 0)
    return corrupt(0, "bad magic (expected \"MMIDIDX\\0\\0\": is this a Megatron .idx?)");
  const auto version = LoadAt<std::uint64_t>(idx, 9);
  if (version != kVersion)
    return Status::Unimplemented(
        fmt::format("{}: Megatron index version {} is not supported (stoker reads version 1)", where, version));
  const auto code = LoadAt<std::uint8_t>(idx, 17);
  const auto type = TokenTypeFromCode(code);
  if (!type) return corrupt(17, fmt::format("unknown token type code {} (Megatron's are 1-8)", code));
  IndexView view;
  view.where_ = where;  // a copy: `corrupt` above still names the file
  view.type_ = *type;
  view.sequences_ = LoadAt<std::uint64_t>(idx, 18);
  view.boundaries_ = LoadAt<std::uint64_t>(idx, 26);
  // The arrays: i32 lengths, i64 pointers, i64 boundaries, then optionally i8 modes.
  const std::uint64_t size = idx.size() - kHeaderSize;
  const std::uint64_t s = view.sequences_, b = view.boundaries_;
  if (s > size / 12 || b > size / 8 || 12 * s + 8 * b > size)
    return corrupt(
        18, fmt::format("{} sequences and {} document boundaries do not fit in the file's {} bytes", s, b, idx.size()));
  const std::uint64_t rest = size - 12 * s - 8 * b;
  if (rest != 0 && rest != s)
    return corrupt(
        kHeaderSize + 12 * s + 8 * b,
        fmt::format("{} bytes follow the document boundaries: neither none nor one mode per sequence ({})", rest, s));
  view.has_modes_ = rest != 0 && s != 0;
  view.lengths_ = idx.data() + kHeaderSize;
  view.pointers_ = view.lengths_ + 4 * s;
  view.boundaries_at_ = view.pointers_ + 8 * s;
  const std::uint64_t token_size = TokenSize(*type);
  std::uint64_t total = 0;
  for (std::uint64_t i = 0; i < s; ++i) {
    const std::int32_t length = view.length(i);
    const std::int64_t pointer = view.pointer(i);
    if (length < 0) return corrupt(kHeaderSize + 4 * i, fmt::format("sequence {} has length {}", i, length));
    if (pointer < 0 || static_cast<std::uint64_t>(pointer) > bin_size ||
        static_cast<std::uint64_t>(length) * token_size > bin_size - static_cast<std::uint64_t>(pointer))
      return corrupt(kHeaderSize + 4 * s + 8 * i,
                     fmt::format("sequence {} ({} tokens at byte {}) lies outside the .bin ({} bytes)", i, length,
                                 pointer, bin_size));
    total += static_cast<std::uint64_t>(length);
  }
  view.total_tokens_ = total;
  const std::uint64_t boundaries_offset = kHeaderSize + 12 * s;
  if (b == 0 && s != 0) return corrupt(26, "no document boundaries, yet there are sequences");
  for (std::uint64_t i = 0; i < b; ++i) {
    const std::int64_t at = view.boundary(i);
    const std::int64_t before = i == 0 ? 0 : view.boundary(i - 1);
    if (i == 0 && at != 0)
      return corrupt(boundaries_offset, fmt::format("the first document boundary is {}, not 0", at));
    if (at < before || static_cast<std::uint64_t>(at) > s)
      return corrupt(boundaries_offset + 8 * i,
                     fmt::format("document boundary {} is {}: outside [{}, {}]", i, at, before, s));
  }
  if (b != 0 && static_cast<std::uint64_t>(view.boundary(b - 1)) != s)
    return corrupt(boundaries_offset + 8 * (b - 1),
                   fmt::format("the last document boundary is {}, not the sequence count {}", view.boundary(b - 1), s));
  return view;
}

Status IndexBuilder::AddDocument(std::uint64_t tokens) {
  if (tokens > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max()))
    return Status::InvalidArgument(
        fmt::format("a document of {} tokens is longer than a Megatron sequence can be (2^31 - 1 tokens)", tokens));
  lengths_.push_back(static_cast<std::int32_t>(tokens));
  return Status::Ok();
}

std::vector<std::byte> IndexBuilder::Finish() const {
  const std::uint64_t n = lengths_.size();
  std::vector<std::byte> out;
  out.reserve(kHeaderSize + 20 * n + 8);
  out.insert(out.end(), reinterpret_cast<const std::byte*>(kMagic),
             reinterpret_cast<const std::byte*>(kMagic) + sizeof(kMagic));
  Append<std::uint64_t>(out, kVersion);
  Append<std::uint8_t>(out, static_cast<std::uint8_t>(type_));
  Append<std::uint64_t>(out, n);
  Append<std::uint64_t>(out, n + 1);
  for (std::int32_t length : lengths_) Append<std::int32_t>(out, length);
  std::int64_t pointer = 0;
  for (std::int32_t length : lengths_) {
    Append<std::int64_t>(out, pointer);
    pointer += static_cast<std::int64_t>(length) * static_cast<std::int64_t>(TokenSize(type_));
  }
  for (std::uint64_t d = 0; d <= n; ++d) Append<std::int64_t>(out, static_cast<std::int64_t>(d));
  return out;
}

}  // namespace stoker::megatron
