// Field decoders from users' shared libraries (stoker/field_extension.h):
// the registry LoadFieldExtension fills, and the FieldKind::kCustom decoder
// that calls one through the C interface.
#pragma once

#include <string_view>

#include "pipeline/field_decoders.h"
#include "stoker/field_extension.h"

namespace stoker::pipeline {

// The decoder registered as `name`, or NotFound naming those there are.
[[nodiscard]] Result<StokerFieldDecodeFn> FindFieldExtension(std::string_view name);

// FieldDecodeFn for kCustom: runs options.custom.
[[nodiscard]] Status DecodeCustomField(std::span<const std::byte> bytes, const FieldSpec& spec,
                                       const FieldDecodeOptions& options, FieldValue* out);

}  // namespace stoker::pipeline
