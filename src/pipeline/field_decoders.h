// The field decoders, one per FieldKind, registered in one table
// (field_decoders.cc): a new kind of field is a new function there and a
// new FieldKind, nothing in the loader. Each runs on the loader's threads.
#pragma once

#include <cstdint>
#include <span>

#include "stoker/field_extension.h"
#include "stoker/fields.h"
#include "stoker/status.h"

namespace stoker::pipeline {

struct FieldDecodeOptions {
  std::uint64_t max_pixels = 0;  // images: TransformOptions::max_pixels
  // kCustom: the extension's function, resolved by name at loader creation.
  StokerFieldDecodeFn custom = nullptr;
};

// Decodes `bytes` as `spec` says into `out` (present set). Errors say what
// is wrong with the bytes (Corruption) or the spec (InvalidArgument); the
// caller adds the sample and where it lies.
using FieldDecodeFn = Status (*)(std::span<const std::byte> bytes, const FieldSpec& spec,
                                 const FieldDecodeOptions& options, FieldValue* out);
[[nodiscard]] FieldDecodeFn FieldDecoderFor(FieldKind kind);

// Checked at loader creation: what a spec of its kind needs (a known image
// mode, at least one key, a name).
[[nodiscard]] Status CheckFieldSpec(const FieldSpec& spec);

// Whether `text` is valid UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF); else where the first bad byte is.
[[nodiscard]] Status CheckUtf8(std::string_view text);

}  // namespace stoker::pipeline
