// TokenDataset and TokenDatasetWriter: Megatron indexed datasets on a FileSystem.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

#include "core/hash.h"
#include "format/megatron_index.h"
#include "remote/remote_file_system.h"
#include "remote/url.h"
#include "stoker/text.h"
#include "stoker/tokens.h"

namespace stoker {
namespace {

using megatron::TokenType;

std::optional<TokenType> TokenTypeByName(std::string_view name) {
  for (std::uint8_t code = 1; code <= 8; ++code) {
    const auto type = *megatron::TokenTypeFromCode(code);
    if (megatron::TokenTypeName(type) == name) return type;
  }
  return std::nullopt;
}

// Calls f(T{}) with T the C++ type of `type`: one switch for every conversion.
template <typename F>
decltype(auto) WithTokenType(TokenType type, F&& f) {
  switch (type) {
    case TokenType::kUInt8:
      return f(std::uint8_t{});
    case TokenType::kInt8:
      return f(std::int8_t{});
    case TokenType::kInt16:
      return f(std::int16_t{});
    case TokenType::kUInt16:
      return f(std::uint16_t{});
    case TokenType::kInt32:
      return f(std::int32_t{});
    case TokenType::kInt64:
      return f(std::int64_t{});
    case TokenType::kFloat32:
      return f(float{});
    case TokenType::kFloat64:
      break;
  }
  return f(double{});
}

// Converts tokens to int64; returns the place of the first that is not a
// token id (a float that is not a whole number within int64's range: NaN,
// 3.5, 1e30), whose conversion would be undefined or lossy, else out.size().
std::size_t ConvertTokens(TokenType type, const std::byte* from, std::span<std::int64_t> out) {
  return WithTokenType(type, [&]<typename T>(T) -> std::size_t {
    for (std::size_t i = 0; i < out.size(); ++i) {
      T v;
      std::memcpy(&v, from + i * sizeof(T), sizeof(T));
      if constexpr (std::is_floating_point_v<T>) {
        // [-2^63, 2^63): both bounds are exact in float and double.
        constexpr T lo = -9223372036854775808.0, hi = 9223372036854775808.0;
        if (!(v >= lo && v < hi) || std::trunc(v) != v) return i;
      }
      out[i] = static_cast<std::int64_t>(v);
    }
    return out.size();
  });
}

// The float at `from` (a token ConvertTokens refused), as text.
std::string FloatTokenText(TokenType type, const std::byte* from) {
  if (type == TokenType::kFloat32) {
    float v;
    std::memcpy(&v, from, sizeof v);
    return fmt::format("{}", v);
  }
  double v;
  std::memcpy(&v, from, sizeof v);
  return fmt::format("{}", v);
}

// Whether `v` is a value of `type`, exactly (floats: integers up to their mantissa's reach).
template <typename T>
bool FitsAs(std::int64_t v) {
  if constexpr (std::is_floating_point_v<T>) {
    constexpr std::int64_t reach = std::int64_t{1} << std::numeric_limits<T>::digits;
    return v >= -reach && v <= reach;
  } else {
    return std::in_range<T>(v);
  }
}

// The place of the first of `tokens` that is not a value of `type`; tokens.size() when all are.
std::size_t FirstMisfit(TokenType type, std::span<const std::int64_t> tokens) {
  return WithTokenType(type, [&]<typename T>(T) {
    for (std::size_t i = 0; i < tokens.size(); ++i)
      if (!FitsAs<T>(tokens[i])) return i;
    return tokens.size();
  });
}

// Appends `tokens` (each of which Fits) to `out` as `type`, little-endian.
void StoreTokens(TokenType type, std::span<const std::int64_t> tokens, std::vector<std::byte>& out) {
  WithTokenType(type, [&]<typename T>(T) {
    const std::size_t at = out.size();
    out.resize(at + tokens.size() * sizeof(T));
    std::byte* to = out.data() + at;
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const T t = static_cast<T>(tokens[i]);
      std::memcpy(to + i * sizeof(T), &t, sizeof(T));
    }
  });
}

}  // namespace

struct TokenDataset::Impl {
  std::string prefix;
  std::shared_ptr<FileSystem> owned_fs;  // a remote dataset's own; before the files, which need it
  std::unique_ptr<MappedFile> idx, bin;
  // Remote: the .bin read through the cache in chunks, with read-ahead hints.
  std::unique_ptr<ReadableFile> bin_file;
  ShardReadPlanner* planner = nullptr;
  ShardCacheControl* cache = nullptr;
  std::uint64_t chunk_bytes = 0;
  megatron::IndexView view;
  std::vector<std::uint64_t> document_tokens;

  // Calls f(byte offset in the .bin, tokens) for each stretch of tokens [offset, offset + count) of `document`.
  template <typename F>
  void ForEachStretch(std::uint64_t document, std::uint64_t offset, std::uint64_t count, F&& f) const {
    const std::size_t size = megatron::TokenSize(view.token_type());
    for (auto s = view.boundary(document); s < view.boundary(document + 1) && count > 0; ++s) {
      const auto length = static_cast<std::uint64_t>(view.length(static_cast<std::uint64_t>(s)));
      if (offset >= length) {
        offset -= length;
        continue;
      }
      const std::uint64_t take = std::min<std::uint64_t>(length - offset, count);
      f(static_cast<std::uint64_t>(view.pointer(static_cast<std::uint64_t>(s))) + offset * size, take);
      count -= take;
      offset = 0;
    }
  }
};

TokenDataset::TokenDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDataset::~TokenDataset() = default;

namespace {

// Opens `impl->prefix` on `fs`: the .idx mapped; the .bin mapped, or (a
// remote file system) read in chunks of `chunk_bytes` through its cache.
Status OpenFiles(TokenDataset::Impl& m, FileSystem* fs, std::uint64_t chunk_bytes) {
  const std::string idx_path = m.prefix + ".idx", bin_path = m.prefix + ".bin";
  STOKER_ASSIGN_OR_RETURN(m.idx, fs->Map(idx_path));
  std::uint64_t bin_size = 0;
  if (fs->read_planner() == nullptr) {
    STOKER_ASSIGN_OR_RETURN(m.bin, fs->Map(bin_path));
    bin_size = m.bin->data().size();
  } else {
    // The .bin's size is what the index says; each chunk's arrival checks it.
    STOKER_ASSIGN_OR_RETURN(auto parsed, megatron::IndexView::Open(m.idx->data(), fs->DisplayName(idx_path),
                                                                   std::numeric_limits<std::uint64_t>::max()));
    bin_size = parsed.total_tokens() * megatron::TokenSize(parsed.token_type());
    const std::uint64_t version = Xxh3(m.idx->data());  // another .idx: another .bin, other cache entries
    STOKER_RETURN_IF_ERROR(fs->AttachChunkedFile(bin_path, bin_size, chunk_bytes, version));
    STOKER_ASSIGN_OR_RETURN(m.bin_file, fs->OpenForRead(bin_path));
    m.planner = fs->read_planner();
    m.cache = fs->shard_cache();
    m.chunk_bytes = chunk_bytes;
  }
  STOKER_ASSIGN_OR_RETURN(m.view, megatron::IndexView::Open(m.idx->data(), fs->DisplayName(idx_path), bin_size));
  const megatron::IndexView& view = m.view;
  const std::uint64_t covered = view.total_tokens() * megatron::TokenSize(view.token_type());
  if (covered != bin_size)
    return Status::Corruption(fmt::format(
        "{}: holds {} bytes, but the sequences of {} cover {} ({} tokens of {}): {}", fs->DisplayName(bin_path),
        bin_size, fs->DisplayName(idx_path), covered, view.total_tokens(), megatron::TokenTypeName(view.token_type()),
        bin_size < covered ? "the .bin is truncated" : "the lengths do not add up to the .bin"));
  m.document_tokens.resize(view.num_documents());
  for (std::uint64_t d = 0; d < view.num_documents(); ++d) {
    std::uint64_t tokens = 0;
    for (auto s = view.boundary(d); s < view.boundary(d + 1); ++s)
      tokens += static_cast<std::uint64_t>(view.length(static_cast<std::uint64_t>(s)));
    m.document_tokens[d] = tokens;
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& prefix, FileSystem* fs,
                                                         std::uint64_t chunk_bytes) {
  if (chunk_bytes == 0) return Status::InvalidArgument("chunk_bytes must be above zero");
  auto impl = std::make_unique<Impl>();
  impl->prefix = prefix;
  STOKER_RETURN_IF_ERROR(OpenFiles(*impl, fs, chunk_bytes));
  return std::unique_ptr<TokenDataset>(new TokenDataset(std::move(impl)));
}

Result<std::unique_ptr<TokenDataset>> TokenDataset::Open(const std::string& location,
                                                         const TokenDatasetOptions& options) {
  // The remote locations this layer opens itself (a scheme registered with
  // RegisterFileSystem opens packed datasets, above this layer).
  if (!remote::IsRemoteUrl(location)) return Open(location, FileSystem::Default());
  if (options.chunk_bytes < (std::uint64_t{64} << 10) || options.chunk_bytes > (std::uint64_t{4} << 30))
    return Status::InvalidArgument(fmt::format("chunk_bytes {} is outside [64 KiB, 4 GiB]", options.chunk_bytes));
  STOKER_ASSIGN_OR_RETURN(remote::RemoteLocation at, remote::OpenRemoteLocation(location, options.remote));
  auto impl = std::make_unique<Impl>();
  impl->prefix = location;
  impl->owned_fs = std::move(at.file_system);
  STOKER_RETURN_IF_ERROR(OpenFiles(*impl, impl->owned_fs.get(), options.chunk_bytes));
  return std::unique_ptr<TokenDataset>(new TokenDataset(std::move(impl)));
}

const std::string& TokenDataset::prefix() const {
  return impl_->prefix;
}
std::uint64_t TokenDataset::num_documents() const {
  return impl_->view.num_documents();
}
std::uint64_t TokenDataset::num_tokens() const {
  return impl_->view.total_tokens();
}
std::string_view TokenDataset::token_type() const {
  return megatron::TokenTypeName(impl_->view.token_type());
}
std::span<const std::uint64_t> TokenDataset::document_tokens() const {
  return impl_->document_tokens;
}

Status TokenDataset::ReadTokens(std::uint64_t document, std::uint64_t offset, std::span<std::int64_t> out) const {
  const megatron::IndexView& view = impl_->view;
  if (document >= view.num_documents())
    return Status::InvalidArgument(
        fmt::format("{}: document {} is past the last ({} documents)", impl_->prefix, document, view.num_documents()));
  const std::uint64_t document_length = impl_->document_tokens[document];
  if (offset > document_length || out.size() > document_length - offset)
    return Status::InvalidArgument(fmt::format("{}: tokens [{}, {}) are outside document {} ({} tokens)", impl_->prefix,
                                               offset, offset + out.size(), document, document_length));
  const std::size_t size = megatron::TokenSize(view.token_type());
  Status status;
  std::vector<std::byte> bytes;     // a remote stretch, read through the cache
  std::uint64_t position = offset;  // in the document, of the stretch's first token
  const auto convert = [&](const std::byte* from, std::span<std::int64_t> into, std::uint64_t at) {
    const std::size_t bad = ConvertTokens(view.token_type(), from, into);
    if (bad == into.size()) return;
    status = Status::Corruption(
        fmt::format("{}.bin: document {} holds {} at position {} (byte {}), which is not a token id (a whole number)",
                    impl_->prefix, document, FloatTokenText(view.token_type(), from + bad * size), position + bad,
                    at + bad * size));
  };
  impl_->ForEachStretch(document, offset, out.size(), [&](std::uint64_t at, std::uint64_t count) {
    std::span<std::int64_t> into = out.first(count);
    out = out.subspan(count);
    if (!status.ok()) return;
    if (impl_->bin) {
      convert(impl_->bin->data().data() + at, into, at);
    } else {
      bytes.resize(count * size);
      auto got = impl_->bin_file->ReadAt(at, bytes);
      if (!got.ok()) {
        status = got.error();
      } else if (*got != bytes.size()) {
        status = Status::Corruption(fmt::format("{}.bin: ends at byte {}, inside document {} (the .idx says more)",
                                                impl_->prefix, at + *got, document));
      } else {
        convert(bytes.data(), into, at);
      }
    }
    position += count;
  });
  return status;
}

std::uint64_t TokenDataset::bin_bytes() const {
  return impl_->view.total_tokens() * megatron::TokenSize(impl_->view.token_type());
}

void TokenDataset::AdviseAccess(AccessPattern pattern) const {
  // A hint: a file system that refuses it reads the same bytes.
  if (impl_->bin) (void)impl_->bin->AdviseAccess(pattern);
  if (impl_->bin_file) (void)impl_->bin_file->AdviseAccess(pattern);
}

bool TokenDataset::remote() const {
  return impl_->planner != nullptr;
}

std::uint64_t TokenDataset::PlanReads(std::span<const TokenRange> ranges) const {
  if (impl_->planner == nullptr) return 0;
  const std::uint64_t size = megatron::TokenSize(impl_->view.token_type());
  std::vector<std::uint32_t> chunks;
  for (const TokenRange& r : ranges) {
    if (r.document >= impl_->view.num_documents()) continue;
    impl_->ForEachStretch(r.document, r.offset, r.length, [&](std::uint64_t at, std::uint64_t count) {
      const std::uint64_t first = at / impl_->chunk_bytes, last = (at + count * size - 1) / impl_->chunk_bytes;
      for (std::uint64_t c = first; c <= last; ++c)
        if (chunks.empty() || chunks.back() != c) chunks.push_back(static_cast<std::uint32_t>(c));
    });
  }
  return impl_->planner->AppendPlan(chunks);
}

void TokenDataset::AdvanceReads(std::uint64_t position) const {
  if (impl_->planner != nullptr) impl_->planner->AdvancePlan(position);
}

void TokenDataset::ResetReads() const {
  if (impl_->planner != nullptr) impl_->planner->ResetPlan();
}

RemoteStats TokenDataset::remote_stats() const {
  return impl_->cache != nullptr ? impl_->cache->stats() : RemoteStats{};
}

struct TokenDatasetWriter::Impl {
  FileSystem* fs = nullptr;
  std::string prefix;
  TokenType type = TokenType::kUInt16;
  std::optional<AtomicFile> bin;
  megatron::IndexBuilder index{TokenType::kUInt16};
  std::vector<std::byte> buffer;
  bool finished = false;
};

TokenDatasetWriter::TokenDatasetWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TokenDatasetWriter::~TokenDatasetWriter() = default;

Result<std::unique_ptr<TokenDatasetWriter>> TokenDatasetWriter::Create(const std::string& prefix,
                                                                       std::string_view token_type, bool overwrite,
                                                                       FileSystem* fs) {
  const auto type = TokenTypeByName(token_type);
  if (!type)
    return Status::InvalidArgument(fmt::format(
        "token type '{}' is not one Megatron writes (uint8, int8, int16, uint16, int32, int64, float32, float64)",
        Printable(token_type)));
  for (const char* ext : {".idx", ".bin"}) {
    const std::string path = prefix + ext;
    if (fs->Stat(path).ok()) {
      if (!overwrite)
        return Status::AlreadyExists(fmt::format("{} exists; pass overwrite (--force) to replace it", path));
      // The old index goes first, so the folder never pairs it with a new .bin.
      STOKER_RETURN_IF_ERROR(fs->Remove(path));
    }
  }
  auto impl = std::make_unique<Impl>();
  impl->fs = fs;
  impl->prefix = prefix;
  impl->type = *type;
  impl->index = megatron::IndexBuilder(*type);
  STOKER_ASSIGN_OR_RETURN(auto bin, AtomicFile::Create(*fs, prefix + ".bin"));
  impl->bin.emplace(std::move(bin));
  return std::unique_ptr<TokenDatasetWriter>(new TokenDatasetWriter(std::move(impl)));
}

Status TokenDatasetWriter::AddDocument(std::span<const std::int64_t> tokens) {
  Impl& m = *impl_;
  if (m.finished) return Status::FailedPrecondition("the token dataset was finished");
  if (const std::size_t i = FirstMisfit(m.type, tokens); i < tokens.size())
    return Status::InvalidArgument(fmt::format("document {}: token {} at position {} does not fit in {}",
                                               m.index.num_documents(), tokens[i], i, megatron::TokenTypeName(m.type)));
  STOKER_RETURN_IF_ERROR(m.index.AddDocument(tokens.size()));
  StoreTokens(m.type, tokens, m.buffer);
  if (m.buffer.size() >= (std::size_t{4} << 20)) {
    STOKER_RETURN_IF_ERROR(m.bin->Append(m.buffer));
    m.buffer.clear();
  }
  return Status::Ok();
}

std::uint64_t TokenDatasetWriter::num_documents() const {
  return impl_->index.num_documents();
}

Status TokenDatasetWriter::Finish() {
  Impl& m = *impl_;
  if (m.finished) return Status::FailedPrecondition("the token dataset was finished");
  m.finished = true;
  STOKER_RETURN_IF_ERROR(m.bin->Append(m.buffer));
  m.buffer.clear();
  STOKER_RETURN_IF_ERROR(m.bin->Commit());
  // The index last: only a complete dataset has one.
  return WriteWholeFileAtomically(*m.fs, m.prefix + ".idx", m.index.Finish());
}

}  // namespace stoker
