// Fuzzes the loader's field decoders on arbitrary bytes, every kind: the
// text number parsers, UTF-8 checking, JSON checking (deep nesting, huge
// numbers, truncation), .npy and TIFF arrays, whole-image decoding in each mode, and the
// targets' decoders (boxes and keypoints from .npy or JSON lists of numbers,
// masks). A malformed field must give an error, never a crash or a wrong
// success.
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/number_array.h"
#include "pipeline/field_decoders.h"
#include "transform/array_transform.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using stoker::FieldKind;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::pipeline::FieldDecodeOptions options;
  options.max_pixels = 1 << 20;
  for (FieldKind kind :
       {FieldKind::kInt, FieldKind::kFloat, FieldKind::kText, FieldKind::kJson, FieldKind::kBytes, FieldKind::kArray,
        FieldKind::kImage, FieldKind::kBoxes, FieldKind::kKeypoints, FieldKind::kMask}) {
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
    // A decoded array through the array transform (any shape and type the decoders give).
    if (s.ok() && kind == FieldKind::kArray) {
      const std::vector<stoker::TransformStep> steps = {{"RandomCrop", {{"size", {2, 3}}}, {}, {}},
                                                        {"RandomHorizontalFlip", {}, {}, {}},
                                                        {"RandomVerticalFlip", {}, {}, {}},
                                                        {"Normalize", {{"mean", {1}}, {"std", {3}}}, {}, {}}};
      stoker::Rng rng(size, size > 0 ? data[0] : 0);
      std::vector<std::byte> scratch;
      stoker::HostTensor t = value.tensor;
      for (const char* layout : {"HWC", "CHW"}) {
        const stoker::Status a = stoker::transform::ApplyArrayTransform(steps, layout, rng, t, scratch);
        if (a.ok() && (t.type != stoker::ElementType::kFloat32 || t.data.size() != t.elements() * 4)) __builtin_trap();
        t = value.tensor;
      }
    }
    if (s.ok() && kind == FieldKind::kArray &&
        value.tensor.data.size() != value.tensor.elements() * ElementSize(value.tensor.type))
      __builtin_trap();
    if (s.ok() && kind == FieldKind::kBoxes &&
        (value.tensor.shape.size() != 2 || value.tensor.shape[1] != 4 ||
         value.tensor.data.size() != static_cast<std::size_t>(value.tensor.shape[0]) * 16))
      __builtin_trap();
  }
  // The JSON number lists on their own: a success is rectangular.
  const auto numbers = stoker::codec::ParseNumberArray({reinterpret_cast<const char*>(data), size});
  if (numbers.ok()) {
    std::size_t expected = 1;
    for (auto d : numbers->shape) expected *= d;
    if (numbers->values.size() != expected) __builtin_trap();
  }
  return 0;
}
