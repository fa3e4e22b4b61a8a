// safetensors::Parse: the header read in one streaming pass (nlohmann's SAX
// interface) straight into TensorLayouts, so reading N tensors costs O(N).
//
// Why not a DOM: detecting duplicate keys needs a parse callback, and
// nlohmann's callback DOM parser scans the whole enclosing object for a
// discarded value after every nested object ends, which made a header of N
// tensors cost O(N^2) (60,000 tensors: over a minute). A handler of our own
// also rejects a malformed header at its first wrong token, without building
// a tree first.
#include <algorithm>
#include <string>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace stoker::safetensors {
namespace {

using Json = nlohmann::json;

std::uint64_t LoadLittleEndian64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
}

// The SAX handler: a small state machine over the only shapes a valid
// header has. Any other token stops the parse with the rule it breaks.
class HeaderReader {
 public:
  HeaderReader(std::uint64_t data_size, ParseWork* work) : data_size_(data_size), work_(work) {}

  [[nodiscard]] const std::string& error() const { return error_; }
  [[nodiscard]] bool done() const { return where_ == Where::kDone; }
  ParsedFile& parsed() { return parsed_; }

  // --- nlohmann::json_sax interface ---
  bool null() { return Value(Token::kOther); }
  bool boolean(bool) { return Value(Token::kOther); }
  bool number_integer(Json::number_integer_t) { return Value(Token::kOther); }
  bool number_unsigned(Json::number_unsigned_t value) {
    unsigned_ = value;
    return Value(Token::kUnsigned);
  }
  bool number_float(Json::number_float_t, const Json::string_t&) { return Value(Token::kOther); }
  bool binary(Json::binary_t&) { return Value(Token::kOther); }
  bool string(Json::string_t& value) {
    string_ = &value;
    return Value(Token::kString);
  }
  bool start_object(std::size_t) {
    if (where_ == Where::kStart) {
      where_ = Where::kTop;
      return true;
    }
    return Value(Token::kObject);
  }
  bool start_array(std::size_t) { return Value(Token::kArray); }
  bool key(Json::string_t& key);
  bool end_object();
  bool end_array();
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception&) {
    if (error_.empty()) error_ = fmt::format("the header is not valid JSON (at byte {} of the header)", position);
    return false;
  }

 private:
  enum class Where { kStart, kTop, kMetadata, kTensor, kShape, kOffsets, kDone };
  enum class Token { kString, kUnsigned, kObject, kArray, kOther };
  enum class Field { kNone, kDType, kShape, kOffsets };

  bool Value(Token token);
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  [[nodiscard]] std::string Named() const { return fmt::format("tensor '{}'", tensor_.name); }
  bool FinishTensor();

  const std::uint64_t data_size_;
  ParseWork* work_;
  Where where_ = Where::kStart;
  std::string error_;
  ParsedFile parsed_;
  std::unordered_set<std::string> top_keys_;
  std::string key_;  // the key whose value comes next (top level or __metadata__)
  // The tensor being read.
  TensorLayout tensor_;
  Field field_ = Field::kNone;
  bool has_dtype_ = false, has_shape_ = false;
  int offsets_seen_ = 0;  // entries of data_offsets; -1: not given
  // The scalar last seen.
  std::uint64_t unsigned_ = 0;
  Json::string_t* string_ = nullptr;
};

bool HeaderReader::key(Json::string_t& key) {
  switch (where_) {
    case Where::kTop:
      if (work_) ++work_->name_lookups;
      if (!top_keys_.insert(key).second) return Fail(fmt::format("duplicate key '{}' in the header", key));
      key_ = key;
      return true;
    case Where::kMetadata:
      if (work_) ++work_->name_lookups;
      if (parsed_.metadata.contains(key)) return Fail(fmt::format("duplicate key '{}' in the header", key));
      key_ = key;
      return true;
    case Where::kTensor: {
      Field field = key == "dtype"          ? Field::kDType
                    : key == "shape"        ? Field::kShape
                    : key == "data_offsets" ? Field::kOffsets
                                            : Field::kNone;
      if (field == Field::kNone) return Fail(fmt::format("{} has an unknown field '{}'", Named(), key));
      const bool seen = field == Field::kDType ? has_dtype_ : field == Field::kShape ? has_shape_ : offsets_seen_ >= 0;
      if (seen) return Fail(fmt::format("duplicate key '{}' in the header", key));
      field_ = field;
      return true;
    }
    default:
      return Fail("unexpected key");  // unreachable: keys come only inside objects
  }
}

bool HeaderReader::Value(Token token) {
  switch (where_) {
    case Where::kStart:
      return Fail("the header is not a JSON object");
    case Where::kTop:
      if (key_ == "__metadata__") {
        if (token != Token::kObject) return Fail("__metadata__ is not an object");
        where_ = Where::kMetadata;
        return true;
      }
      tensor_ = TensorLayout{};
      tensor_.name = std::move(key_);
      if (token != Token::kObject) return Fail(Named() + " is not an object");
      has_dtype_ = has_shape_ = false;
      offsets_seen_ = -1;
      where_ = Where::kTensor;
      return true;
    case Where::kMetadata:
      if (token != Token::kString) return Fail(fmt::format("__metadata__ value of '{}' is not a string", key_));
      parsed_.metadata.emplace(std::move(key_), std::move(*string_));
      return true;
    case Where::kTensor:
      switch (field_) {
        case Field::kDType: {
          if (token != Token::kString) return Fail(Named() + " has no dtype string");
          const auto dtype = ParseTensorDType(*string_);
          if (!dtype) return Fail(fmt::format("{} has an unsupported dtype '{}'", Named(), *string_));
          tensor_.dtype = *dtype;
          has_dtype_ = true;
          return true;
        }
        case Field::kShape:
          if (token != Token::kArray) return Fail(Named() + " has no shape array");
          has_shape_ = true;
          where_ = Where::kShape;
          return true;
        case Field::kOffsets:
          if (token != Token::kArray) return Fail(Named() + " has no data_offsets pair of non-negative integers");
          offsets_seen_ = 0;
          where_ = Where::kOffsets;
          return true;
        case Field::kNone:
          return Fail("unexpected value");  // unreachable: a value follows a key
      }
      return false;
    case Where::kShape:
      if (token != Token::kUnsigned) return Fail(Named() + " has a shape entry that is not a non-negative integer");
      tensor_.shape.push_back(unsigned_);
      return true;
    case Where::kOffsets:
      if (token != Token::kUnsigned || offsets_seen_ >= 2)
        return Fail(Named() + " has no data_offsets pair of non-negative integers");
      (offsets_seen_ == 0 ? tensor_.begin : tensor_.end) = unsigned_;
      ++offsets_seen_;
      return true;
    case Where::kDone:
      return Fail("data after the header's object");  // unreachable: nlohmann stops at the object's end
  }
  return false;
}

bool HeaderReader::end_array() {
  if (where_ != Where::kShape && where_ != Where::kOffsets) return Fail("unexpected end of array");  // unreachable
  where_ = Where::kTensor;
  return true;
}

bool HeaderReader::end_object() {
  switch (where_) {
    case Where::kTop:
      where_ = Where::kDone;
      return true;
    case Where::kMetadata:
      where_ = Where::kTop;
      return true;
    case Where::kTensor:
      where_ = Where::kTop;
      return FinishTensor();
    default:
      return Fail("unexpected end of object");  // unreachable
  }
}

bool HeaderReader::FinishTensor() {
  TensorLayout& t = tensor_;
  if (!has_dtype_) return Fail(Named() + " has no dtype string");
  if (!has_shape_) return Fail(Named() + " has no shape array");
  if (offsets_seen_ != 2) return Fail(Named() + " has no data_offsets pair of non-negative integers");
  if (t.begin > t.end)
    return Fail(fmt::format("{} has data_offsets [{}, {}] that run backwards", Named(), t.begin, t.end));
  auto bytes = TensorBytes(t.dtype, t.shape);
  if (!bytes.ok()) return Fail(Named() + ": " + bytes.error().message());
  if (*bytes != t.end - t.begin)
    return Fail(fmt::format("{} of dtype {} and shape [{}] needs {} bytes but data_offsets [{}, {}] hold {}", Named(),
                            TensorDTypeName(t.dtype), fmt::join(t.shape, ", "), *bytes, t.begin, t.end,
                            t.end - t.begin));
  if (t.end > data_size_)
    return Fail(fmt::format("{} ends at data offset {}, past the data buffer of {} bytes", Named(), t.end, data_size_));
  parsed_.tensors.push_back(std::move(t));
  return true;
}

}  // namespace

Result<ParsedFile> Parse(std::span<const std::byte> file, std::string_view file_name, ParseWork* work) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("'{}' is not a valid safetensors file: {}", file_name, what));
  };
  if (file.size() < 8) return bad(fmt::format("{} bytes, shorter than the 8-byte header length", file.size()));
  const std::uint64_t n = LoadLittleEndian64(file.data());
  if (n > kMaxHeaderBytes) return bad(fmt::format("header length {} exceeds the limit of {}", n, kMaxHeaderBytes));
  if (n > file.size() - 8)
    return bad(fmt::format("header length {} runs past the end of the file ({} bytes)", n, file.size()));
  if (n == 0 || file[8] != std::byte{'{'}) return bad("the header does not start with '{'");
  const char* text = reinterpret_cast<const char*>(file.data() + 8);
  if (work) work->json_bytes += n;

  const std::uint64_t data_offset = 8 + n;
  HeaderReader reader(file.size() - data_offset, work);
  const bool ok = Json::sax_parse(text, text + n, &reader, nlohmann::detail::input_format_t::json, /*strict=*/true);
  if (!reader.error().empty()) return bad(reader.error());
  if (!ok || !reader.done()) return bad("the header is not valid JSON");
  ParsedFile parsed = std::move(reader.parsed());
  parsed.data_offset = data_offset;
  std::sort(parsed.tensors.begin(), parsed.tensors.end(), [](const TensorLayout& a, const TensorLayout& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (const auto& t : parsed.tensors) {
    if (t.begin != covered)
      return bad(fmt::format("tensor '{}' starts at data offset {} but the previous tensor ends at {} ({})", t.name,
                             t.begin, covered, t.begin > covered ? "a hole" : "an overlap"));
    covered = t.end;
  }
  if (covered != file.size() - data_offset)
    return bad(fmt::format("the tensors cover {} bytes of a {}-byte data buffer", covered, file.size() - data_offset));
  return parsed;
}

}  // namespace stoker::safetensors
