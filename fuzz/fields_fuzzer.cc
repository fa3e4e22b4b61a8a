// Fuzzes the loader's field decoders on arbitrary bytes, every kind: the
// text number parsers, UTF-8 checking, JSON checking (deep nesting, huge
// numbers, truncation), .npy, and whole-image decoding in each mode. A
// malformed field must give an error, never a crash or a wrong success.
#include <cstddef>
#include <cstdint>
#include <span>

#include "pipeline/field_decoders.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using stoker::FieldKind;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::pipeline::FieldDecodeOptions options;
  options.max_pixels = 1 << 20;
  for (FieldKind kind : {FieldKind::kInt, FieldKind::kFloat, FieldKind::kText, FieldKind::kJson, FieldKind::kBytes,
                         FieldKind::kArray, FieldKind::kImage}) {
    stoker::FieldSpec spec;
    spec.name = "f";
    spec.kind = kind;
    spec.keys = {"x"};
    spec.mode = size > 0 && data[0] % 2 ? "L" : "RGBA";
    stoker::FieldValue value;
    const stoker::Status s = stoker::pipeline::FieldDecoderFor(kind)(bytes, spec, options, &value);
    // What succeeds is what the kind promises.
    if (s.ok() && (kind == FieldKind::kText || kind == FieldKind::kJson) && value.bytes.size() != size)
      __builtin_trap();
    if (s.ok() && (kind == FieldKind::kInt || kind == FieldKind::kFloat) && value.tensor.data.size() != 8)
      __builtin_trap();
  }
  return 0;
}
