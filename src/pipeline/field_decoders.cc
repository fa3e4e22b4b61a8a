#include "pipeline/field_decoders.h"

#include <charconv>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "codec/image_decode.h"
#include "codec/npy.h"
#include "pipeline/field_extension.h"

namespace stoker {

std::string_view FieldKindName(FieldKind kind) {
  switch (kind) {
    case FieldKind::kImage:
      return "image";
    case FieldKind::kInt:
      return "int";
    case FieldKind::kFloat:
      return "float";
    case FieldKind::kArray:
      return "array";
    case FieldKind::kText:
      return "text";
    case FieldKind::kJson:
      return "json";
    case FieldKind::kBytes:
      return "bytes";
    case FieldKind::kCustom:
      return "custom";
  }
  return "?";
}

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
  if (!mode) return Status::InvalidArgument(fmt::format("image mode '{}'", spec.mode));
  // Per-thread buffers: a worker decodes many images one after another.
  thread_local codec::SourceImage source;
  thread_local codec::Pixels pixels;
  STOKER_RETURN_IF_ERROR(codec::DecodeImageAs(bytes, *mode, options.max_pixels, &source, &pixels));
  out->tensor.type = pixels.bytes_per_channel == 2 ? ElementType::kUInt16 : ElementType::kUInt8;
  out->tensor.shape = {pixels.height, pixels.width, pixels.channels};
  out->tensor.data.resize(pixels.data.size());
  std::memcpy(out->tensor.data.data(), pixels.data.data(), pixels.data.size());
  return Status::Ok();
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

Status DecodeArrayField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&,
                        FieldValue* out) {
  auto array = codec::ParseNpy(bytes);
  if (!array.ok()) return array.status();
  out->tensor.type = array->type;
  out->tensor.shape = array->shape;
  out->tensor.data.resize(array->data.size());
  codec::CopyNpyData(*array, out->tensor.data.data());
  return Status::Ok();
}

Status DecodeTextField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&, FieldValue* out) {
  const std::string_view text = AsText(bytes);
  STOKER_RETURN_IF_ERROR(CheckUtf8(text));
  out->bytes.assign(text);
  return Status::Ok();
}

Status DecodeJsonField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&, FieldValue* out) {
  const std::string_view text = AsText(bytes);
  STOKER_RETURN_IF_ERROR(CheckUtf8(text));
  // Checked here, off the GIL, so a malformed file is named with its
  // sample; the text is what the consumer parses into its own objects.
  // (accept() builds no tree; the parser keeps its own stack, so deep
  // nesting cannot overflow ours.)
  if (!nlohmann::json::accept(text)) {
    try {  // the rare path: parse again for the message with the position
      const auto parsed = nlohmann::json::parse(text);
      (void)parsed;
    } catch (const nlohmann::json::parse_error& e) {
      return Status::Corruption(fmt::format("not valid JSON: {}", e.what()));
    }
    return Status::Corruption("not valid JSON");
  }
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
    return Status::InvalidArgument(
        fmt::format("field '{}': image mode '{}' (RGB, L, RGBA or I;16)", spec.name, spec.mode));
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
