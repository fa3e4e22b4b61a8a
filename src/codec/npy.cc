#include "codec/npy.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace stoker::codec {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// NumPy writes headers of a few hundred bytes; a bound stops a hostile
// header length from making the parser walk gigabytes.
constexpr std::size_t kMaxHeader = 1u << 20;
constexpr int kMaxDims = 32;  // NumPy's own limit (NPY_MAXDIMS)

// A cursor over the header's Python literal: {'descr': '<f4',
// 'fortran_order': False, 'shape': (3, 4), }
class Literal {
 public:
  explicit Literal(std::string_view text) : text_(text) {}

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  bool Eat(char c) {
    SkipSpace();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool AtEnd() {
    SkipSpace();
    return pos_ == text_.size();
  }
  std::optional<std::string> String() {
    SkipSpace();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    const char quote = text_[pos_++];
    const std::size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) return std::nullopt;  // no escapes in what NumPy writes
    pos_ = end + 1;
    return s;
  }
  std::optional<bool> Bool() {
    SkipSpace();
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, {std::string_view("False"), false}})
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    return std::nullopt;
  }
  std::optional<std::int64_t> Int() {
    SkipSpace();
    std::int64_t v = 0;
    const char* begin = text_.data() + pos_;
    const auto [end, ec] = std::from_chars(begin, text_.data() + text_.size(), v);
    if (ec != std::errc() || end == begin || v < 0) return std::nullopt;
    pos_ += static_cast<std::size_t>(end - begin);
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;  // Python 2's long
    return v;
  }
  std::optional<std::vector<std::int64_t>> Shape() {
    if (!Eat('(')) return std::nullopt;
    std::vector<std::int64_t> shape;
    for (;;) {
      if (Eat(')')) return shape;
      auto v = Int();
      if (!v || shape.size() >= kMaxDims) return std::nullopt;
      shape.push_back(*v);
      if (Eat(')')) return shape;
      if (!Eat(',')) return std::nullopt;
    }
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

struct Dtype {
  ElementType type;
  bool swapped;
};

Result<Dtype> ParseDescr(const std::string& descr) {
  const auto bad = [&] {
    return Status::Unimplemented(fmt::format(
        "npy: dtype '{}' is not loaded (bool, int8-64, uint8-64 and float16-64 are; object arrays would run "
        "pickle, structured, complex, string and datetime arrays are not supported)",
        descr));
  };
  if (descr.size() < 3) return bad();
  const char order = descr[0];
  if (order != '<' && order != '>' && order != '|' && order != '=') return bad();
  const char kind = descr[1];
  int size = 0;
  const auto [end, ec] = std::from_chars(descr.data() + 2, descr.data() + descr.size(), size);
  if (ec != std::errc() || end != descr.data() + descr.size()) return bad();
  std::optional<ElementType> type;
  if (kind == 'b' && size == 1) type = ElementType::kBool;
  if (kind == 'i') {
    if (size == 1) type = ElementType::kInt8;
    if (size == 2) type = ElementType::kInt16;
    if (size == 4) type = ElementType::kInt32;
    if (size == 8) type = ElementType::kInt64;
  }
  if (kind == 'u') {
    if (size == 1) type = ElementType::kUInt8;
    if (size == 2) type = ElementType::kUInt16;
    if (size == 4) type = ElementType::kUInt32;
    if (size == 8) type = ElementType::kUInt64;
  }
  if (kind == 'f') {
    if (size == 2) type = ElementType::kFloat16;
    if (size == 4) type = ElementType::kFloat32;
    if (size == 8) type = ElementType::kFloat64;
  }
  if (!type) return bad();
  const bool little = std::endian::native == std::endian::little;
  const bool swapped = size > 1 && ((order == '<' && !little) || (order == '>' && little));
  return Dtype{*type, swapped};
}

}  // namespace

std::uint64_t NpyArray::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

Result<NpyArray> ParseNpy(std::span<const std::byte> npy) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(npy.data());
  if (npy.size() < 10 || std::memcmp(bytes, kMagic.data(), kMagic.size()) != 0)
    return Status::Corruption("npy: not a .npy file (no \\x93NUMPY magic)");
  const int major = bytes[6];
  std::size_t header_len = 0, header_at = 0;
  if (major == 1) {
    header_len = bytes[8] | (std::size_t{bytes[9]} << 8);
    header_at = 10;
  } else if (major == 2 || major == 3) {
    if (npy.size() < 12) return Status::Corruption("npy: truncated header");
    header_len =
        bytes[8] | (std::size_t{bytes[9]} << 8) | (std::size_t{bytes[10]} << 16) | (std::size_t{bytes[11]} << 24);
    header_at = 12;
  } else {
    return Status::Corruption(fmt::format("npy: unknown format version {}.{}", major, int{bytes[7]}));
  }
  if (header_len > kMaxHeader || header_at + header_len > npy.size())
    return Status::Corruption(
        fmt::format("npy: header of {} bytes does not fit in the {} bytes of the field", header_len, npy.size()));
  const std::string_view header(reinterpret_cast<const char*>(bytes + header_at), header_len);

  Literal lit(header);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<std::int64_t>> shape;
  const auto malformed = [&](std::string_view what) {
    return Status::Corruption(fmt::format("npy: malformed header ({}): {}", what, header.substr(0, 200)));
  };
  if (!lit.Eat('{')) return malformed("no dictionary");
  while (!lit.Eat('}')) {
    auto key = lit.String();
    if (!key || !lit.Eat(':')) return malformed("a key");
    if (*key == "descr" && !descr) {
      descr = lit.String();
      if (!descr) return malformed("'descr' is not a simple type string");
    } else if (*key == "fortran_order" && !fortran) {
      fortran = lit.Bool();
      if (!fortran) return malformed("'fortran_order'");
    } else if (*key == "shape" && !shape) {
      shape = lit.Shape();
      if (!shape) return malformed("'shape'");
    } else {
      return malformed(fmt::format("unexpected or repeated key '{}'", *key));
    }
    if (lit.Eat('}')) break;
    if (!lit.Eat(',')) return malformed("expected ','");
  }
  // What follows the dictionary is padding: spaces and a newline.
  if (!lit.AtEnd()) return malformed("text after the dictionary");
  if (!descr || !fortran || !shape) return malformed("'descr', 'fortran_order' and 'shape' are all needed");

  auto dtype = ParseDescr(*descr);
  if (!dtype.ok()) return dtype.status();
  NpyArray array;
  array.type = dtype->type;
  array.byte_swapped = dtype->swapped;
  array.fortran_order = *fortran;
  array.shape = std::move(*shape);
  // The data's size, without overflow: a header may claim anything.
  const std::size_t available = npy.size() - header_at - header_len;
  std::uint64_t need = ElementSize(array.type);
  bool overflow = false, empty = false;
  for (auto d : array.shape) {
    if (d == 0) empty = true;
    overflow = overflow || __builtin_mul_overflow(need, static_cast<std::uint64_t>(d), &need);
  }
  if (empty) need = 0, overflow = false;
  if (overflow || need != available)
    return Status::Corruption(
        fmt::format("npy: the header's shape ({}) of {} needs {} bytes of data; the field holds {}",
                    fmt::join(array.shape, ", "), ElementTypeName(array.type),
                    overflow ? fmt::format("more than {}", available) : std::to_string(need), available));
  array.data = npy.subspan(header_at + header_len);
  return array;
}

void CopyNpyData(const NpyArray& array, std::byte* out) {
  const std::size_t size = ElementSize(array.type);
  const std::uint64_t n = array.elements();
  const std::byte* in = array.data.data();
  if (n == 0) return;  // (no data: `in` and `out` may be null)
  const auto put = [&](std::uint64_t to, std::uint64_t from) {
    std::byte* o = out + to * size;
    const std::byte* i = in + from * size;
    if (array.byte_swapped) {
      for (std::size_t b = 0; b < size; ++b) o[b] = i[size - 1 - b];
    } else {
      std::memcpy(o, i, size);
    }
  };
  if (!array.fortran_order || array.shape.size() < 2) {
    if (!array.byte_swapped) {
      std::memcpy(out, in, n * size);
    } else {
      for (std::uint64_t e = 0; e < n; ++e) put(e, e);
    }
    return;
  }
  // Fortran order: walk the C-order index, keeping the Fortran offset.
  const std::size_t dims = array.shape.size();
  std::vector<std::int64_t> index(dims, 0);
  std::vector<std::uint64_t> fortran_stride(dims, 1);
  for (std::size_t d = 1; d < dims; ++d)
    fortran_stride[d] = fortran_stride[d - 1] * static_cast<std::uint64_t>(array.shape[d - 1]);
  std::uint64_t from = 0;
  for (std::uint64_t e = 0; e < n; ++e) {
    put(e, from);
    for (std::size_t d = dims; d-- > 0;) {
      if (++index[d] < array.shape[d]) {
        from += fortran_stride[d];
        break;
      }
      from -= fortran_stride[d] * static_cast<std::uint64_t>(array.shape[d] - 1);
      index[d] = 0;
    }
  }
}

Status DecodeNpyTensor(std::span<const std::byte> npy, HostTensor* out) {
  auto array = ParseNpy(npy);
  if (!array.ok()) return array.status();
  out->type = array->type;
  out->shape = array->shape;
  if (!array->byte_swapped && (!array->fortran_order || array->shape.size() < 2)) {
    // Already C order and host order: copied as it is, without zeroing a
    // buffer first (resize would: a sample's whole array, every sample).
    out->data.assign(array->data.begin(), array->data.end());
    return Status::Ok();
  }
  out->data.resize(array->data.size());
  CopyNpyData(*array, out->data.data());
  return Status::Ok();
}

}  // namespace stoker::codec
