// Fuzzes the loader's field decoders on arbitrary bytes, every kind: the
// text number parsers, UTF-8 checking, JSON checking (deep nesting, huge
// numbers, truncation), .npy and TIFF arrays, whole-image decoding in each mode, and the
// targets' decoders (boxes and keypoints from .npy or JSON lists of numbers,
// masks in each mode), then every decoded array or mask moved as a target
// that follows a rotated, cropped, flipped image. A malformed field must
// give an error, never a crash or a wrong success.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "codec/number_array.h"
#include "pipeline/field_decoders.h"
#include "transform/array_transform.h"
#include "transform/follow_raster.h"
#include "transform/step.h"

namespace {

// A decoded raster moved as a following target: through a rotation, a crop
// of most of it, a resize to another size and a flip. A success has the
// crop's output size and whole elements.
void FollowAsTarget(const stoker::HostTensor& decoded, const char* layout, double fill) {
  using stoker::transform::SampleGeometry;
  if (decoded.shape.size() < 2 || decoded.shape.size() > 3) return;
  const bool chw = layout[0] == 'C' && decoded.shape.size() == 3;
  const std::int64_t h = decoded.shape[chw ? 1 : 0], w = decoded.shape[chw ? 2 : 1];
  if (h <= 0 || w <= 0 || h > 4096 || w > 4096) return;
  static const auto rotation =
      stoker::transform::MakeStep(stoker::TransformStep{"RandomRotation", {{"degrees", {30}}}, {}, {}});
  if (!rotation.ok()) __builtin_trap();
  SampleGeometry g;
  g.valid = true;
  g.source = {static_cast<int>(w), static_cast<int>(h)};
  g.before.push_back({rotation->get(), {"RandomRotation", {{"angle", 17.0}}, {}}, g.source});
  g.crop = SampleGeometry::Crop::kBox;
  g.box = {0, 0, static_cast<double>(w), static_cast<double>(h)};
  if (w > 2 && h > 2) g.box = {1, 1, static_cast<double>(w - 1), static_cast<double>(h - 1)};
  g.out = {static_cast<int>(w % 7 + 3), static_cast<int>(h % 5 + 2)};
  g.flip = true;
  stoker::HostTensor t = decoded;
  stoker::transform::RasterScratch scratch;
  const stoker::Status s = stoker::transform::FollowRaster(g, "array", layout, fill, t, scratch);
  if (!s.ok()) return;
  const std::size_t rank = t.shape.size();
  const std::int64_t out_h = t.shape[chw ? 1 : 0], out_w = t.shape[chw ? 2 : 1];
  if (rank != decoded.shape.size() || out_h != g.out.height || out_w != g.out.width ||
      t.data.size() != t.elements() * stoker::ElementSize(t.type))
    __builtin_trap();
}

}  // namespace

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
    spec.mask_mode = size == 0 ? "L" : data[0] % 3 == 0 ? "L" : data[0] % 3 == 1 ? "I;16" : "RGB";
    stoker::FieldValue value;
    const stoker::Status s = stoker::pipeline::FieldDecoderFor(kind)(bytes, spec, options, &value);
    // What succeeds is what the kind promises.
    if (s.ok() && (kind == FieldKind::kText || kind == FieldKind::kJson) && value.bytes.size() != size)
      __builtin_trap();
    if (s.ok() && (kind == FieldKind::kInt || kind == FieldKind::kFloat) && value.tensor.data.size() != 8)
      __builtin_trap();
    // A decoded array through the array transform (any shape and type the decoders give).
    if (s.ok() && kind == FieldKind::kArray) {
      const bool nearest = size > 1 && data[1] % 2 == 0;  // bilinear refuses bool arrays: nearest takes them
      const std::vector<stoker::TransformStep> steps = {
          {"RandomCrop", {{"size", {2, 3}}}, {}, {}},
          {"RandomHorizontalFlip", {}, {}, {}},
          {"RandomVerticalFlip", {}, {}, {}},
          {"Resize", {{"size", {5, 4}}}, {{"interpolation", nearest ? "nearest" : "bilinear"}}, {}},
          {"Resize", {{"size", {2}}}, {}, {}},
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
    if (s.ok() && (kind == FieldKind::kArray || kind == FieldKind::kMask)) {
      FollowAsTarget(value.tensor, "HWC", size > 1 ? data[1] % 3 : 0);
      if (kind == FieldKind::kArray) FollowAsTarget(value.tensor, "CHW", std::nan(""));
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
