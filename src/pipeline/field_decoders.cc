#include "pipeline/field_decoders.h"

#include <cctype>
#include <charconv>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "codec/array_decode.h"
#include "codec/image_decode.h"
#include "codec/npy.h"
#include "pipeline/field_extension.h"
#include "pipeline/target_fields.h"
#include "transform/array_transform.h"

namespace stoker {

namespace pipeline {
namespace {

std::string_view AsText(std::span<const std::byte> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Numbers stored as text, as WebDataset writes them: surrounding white
// space allowed, nothing else.
std::string_view Trimmed(std::string_view s) {
  const auto first = s.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  return s.substr(first, s.find_last_not_of(" \t\r\n") - first + 1);
}

void Scalar(ElementType type, const void* value, FieldValue* out) {
  out->tensor.type = type;
  out->tensor.shape.clear();
  out->tensor.data.resize(ElementSize(type));
  std::memcpy(out->tensor.data.data(), value, ElementSize(type));
}

Status DecodeImageField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                        FieldValue* out) {
  const auto mode = codec::ParseColorMode(spec.mode);
  if (!mode) return codec::UnknownColorMode(spec.mode);
  // Per-thread buffers: a worker decodes many images one after another.
  thread_local codec::SourceImage source;
  thread_local codec::Pixels pixels;
  return codec::DecodeImageTensor(bytes, *mode, options.max_pixels, &source, &pixels, &out->tensor);
}

Status DecodeIntField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&, FieldValue* out) {
  const std::string_view text = Trimmed(AsText(bytes));
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return Status::Corruption(fmt::format("'{}' is not an integer", text.substr(0, 40)));
  Scalar(ElementType::kInt64, &v, out);
  return Status::Ok();
}

Status DecodeFloatField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&,
                        FieldValue* out) {
  const std::string_view text = Trimmed(AsText(bytes));
  double v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size())
    return Status::Corruption(fmt::format("'{}' is not a number", text.substr(0, 40)));
  Scalar(ElementType::kFloat64, &v, out);
  return Status::Ok();
}

// An .npy, or a TIFF's samples as stored (multi-band, float, signed: what
// no image mode holds), told apart by their first bytes.
Status DecodeArrayField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions& options,
                        FieldValue* out) {
  return codec::DecodeArrayTensor(bytes, options.max_pixels, &out->tensor);
}

Status DecodeTextField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&, FieldValue* out) {
  const std::string_view text = AsText(bytes);
  STOKER_RETURN_IF_ERROR(CheckUtf8(text));
  out->bytes.assign(text);
  return Status::Ok();
}

// RFC 8259's grammar, checked in one pass with an explicit stack (deep
// nesting cannot overflow ours); numbers by their grammar only, so 1e400
// passes, as Python's json.loads takes it. UTF-8 was checked before.
Status CheckJson(std::string_view t) {
  std::size_t i = 0;
  const std::size_t n = t.size();
  const auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("not valid JSON: {} at byte {}", what, i));
  };
  const auto space = [&] {
    while (i < n && (t[i] == ' ' || t[i] == '\t' || t[i] == '\n' || t[i] == '\r')) ++i;
  };
  const auto digits = [&] {
    const std::size_t start = i;
    while (i < n && t[i] >= '0' && t[i] <= '9') ++i;
    return i > start;
  };
  // A string at i (its opening quote): false with `why` set when malformed.
  std::string_view why;
  const auto string = [&] {
    ++i;
    for (;;) {
      if (i >= n) return why = "unterminated string", false;
      const auto ch = static_cast<unsigned char>(t[i]);
      if (ch == '"') return ++i, true;
      if (ch < 0x20) return why = "control character in a string", false;
      if (ch == '\\') {
        if (++i >= n) return why = "unterminated escape", false;
        if (t[i] == 'u') {
          for (int k = 0; k < 4; ++k)
            if (++i >= n || !std::isxdigit(static_cast<unsigned char>(t[i]))) return why = "bad \\u escape", false;
        } else if (std::string_view("\"\\/bfnrt").find(t[i]) == std::string_view::npos) {
          return why = "bad escape", false;
        }
      }
      ++i;
    }
  };
  enum class Next { kValue, kKey, kAfterValue };
  std::vector<char> stack;  // '[' or '{' per open container
  Next next = Next::kValue;
  for (;;) {
    space();
    if (next == Next::kKey) {
      if (i >= n || t[i] != '"') return bad("expected a key");
      if (!string()) return bad(why);
      space();
      if (i >= n || t[i] != ':') return bad("expected ':'");
      ++i;
      next = Next::kValue;
      continue;
    }
    if (next == Next::kValue) {
      if (i >= n) return bad("unexpected end");
      const char c = t[i];
      if (c == '{' || c == '[') {
        stack.push_back(c);
        ++i;
        space();
        if (i < n && t[i] == (c == '{' ? '}' : ']')) {
          stack.pop_back();
          ++i;
          next = Next::kAfterValue;
        } else {
          next = c == '{' ? Next::kKey : Next::kValue;
        }
        continue;
      }
      if (c == '"') {
        if (!string()) return bad(why);
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-') ++i;
        if (i < n && t[i] == '0') {
          ++i;
        } else if (!digits()) {
          return bad("bad number");
        }
        if (i < n && t[i] == '.') {
          ++i;
          if (!digits()) return bad("bad number");
        }
        if (i < n && (t[i] == 'e' || t[i] == 'E')) {
          ++i;
          if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
          if (!digits()) return bad("bad number");
        }
      } else if (t.substr(i, 4) == "true" || t.substr(i, 4) == "null") {
        i += 4;
      } else if (t.substr(i, 5) == "false") {
        i += 5;
      } else {
        return bad("unexpected character");
      }
      next = Next::kAfterValue;
      continue;
    }
    // After a value: the document's end, a ',' or the closing bracket.
    if (stack.empty()) return i == n ? Status::Ok() : bad("text after the document");
    if (i >= n) return bad("unexpected end");
    if (t[i] == ',') {
      ++i;
      next = stack.back() == '{' ? Next::kKey : Next::kValue;
    } else if (t[i] == (stack.back() == '{' ? '}' : ']')) {
      stack.pop_back();
      ++i;
    } else {
      return bad(stack.back() == '{' ? "expected ',' or '}'" : "expected ',' or ']'");
    }
  }
}

Status DecodeJsonField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&, FieldValue* out) {
  const std::string_view text = AsText(bytes);
  STOKER_RETURN_IF_ERROR(CheckUtf8(text));
  // Checked here, off the GIL, so a malformed file is named with its
  // sample; the text is what the consumer parses into its own objects.
  STOKER_RETURN_IF_ERROR(CheckJson(text));
  out->bytes.assign(text);
  return Status::Ok();
}

Status DecodeBytesField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&,
                        FieldValue* out) {
  out->bytes.assign(AsText(bytes));
  return Status::Ok();
}

struct Entry {
  FieldKind kind;
  FieldDecodeFn decode;
};
// The registry.
constexpr Entry kDecoders[] = {
    {FieldKind::kImage, DecodeImageField}, {FieldKind::kInt, DecodeIntField},
    {FieldKind::kFloat, DecodeFloatField}, {FieldKind::kArray, DecodeArrayField},
    {FieldKind::kText, DecodeTextField},   {FieldKind::kJson, DecodeJsonField},
    {FieldKind::kBytes, DecodeBytesField}, {FieldKind::kCustom, DecodeCustomField},
    {FieldKind::kBoxes, DecodeBoxesField}, {FieldKind::kKeypoints, DecodeKeypointsField},
    {FieldKind::kMask, DecodeMaskField},
};

}  // namespace

FieldDecodeFn FieldDecoderFor(FieldKind kind) {
  for (const Entry& e : kDecoders)
    if (e.kind == kind) return e.decode;
  return nullptr;
}

Status CheckFieldSpec(const FieldSpec& spec) {
  if (spec.name.empty()) return Status::InvalidArgument("a field spec needs a name");
  if (spec.keys.empty()) return Status::InvalidArgument(fmt::format("field '{}' names no keys", spec.name));
  if (FieldDecoderFor(spec.kind) == nullptr)
    return Status::InvalidArgument(fmt::format("field '{}': unknown kind {}", spec.name, static_cast<int>(spec.kind)));
  if (spec.kind == FieldKind::kImage && !codec::ParseColorMode(spec.mode))
    return codec::UnknownColorMode(spec.mode).WithContext(fmt::format("field '{}'", spec.name));
  if (spec.kind == FieldKind::kCustom) {
    if (spec.decoder.empty())
      return Status::InvalidArgument(fmt::format("field '{}': a custom field names its decoder", spec.name));
    if (auto found = FindFieldExtension(spec.decoder); !found.ok())
      return found.status().WithContext(fmt::format("field '{}'", spec.name));
  }
  if (spec.transformed && spec.kind != FieldKind::kImage)
    return Status::InvalidArgument(fmt::format("field '{}': only an image can be transformed", spec.name));
  if (spec.transformed && spec.mode != "RGB")
    return Status::InvalidArgument(
        fmt::format("field '{}': a transformed image is RGB (mode '{}' asked)", spec.name, spec.mode));
  if (!spec.array_transform.empty() && spec.kind != FieldKind::kArray)
    return Status::InvalidArgument(fmt::format("field '{}': only an Array takes an array transform", spec.name));
  if (!spec.array_transform.empty())
    return transform::CheckArrayTransform(spec.array_transform, spec.array_layout)
        .WithContext(fmt::format("field '{}'", spec.name));
  return Status::Ok();
}

Status CheckUtf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  std::size_t i = 0;
  while (i < n) {
    const unsigned c = s[i];
    std::size_t len = 0;
    std::uint32_t cp = 0, min = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07, min = 0x10000;
    } else {
      return Status::Corruption(fmt::format("invalid UTF-8 at byte {}", i));
    }
    if (i + len > n) return Status::Corruption(fmt::format("invalid UTF-8 at byte {} (truncated sequence)", i));
    for (std::size_t k = 1; k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return Status::Corruption(fmt::format("invalid UTF-8 at byte {}", i + k));
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return Status::Corruption(fmt::format("invalid UTF-8 at byte {} (overlong, surrogate or out of range)", i));
    i += len;
  }
  return Status::Ok();
}

}  // namespace pipeline
}  // namespace stoker
