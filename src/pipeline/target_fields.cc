#include "pipeline/target_fields.h"

#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "codec/image_decode.h"
#include "codec/npy.h"
#include "codec/number_array.h"
#include "transform/array_transform.h"

namespace stoker::pipeline {
namespace {

// The numbers of a .npy (any integer or float dtype) or of a JSON list of
// lists, as float64, with their shape.
Result<codec::NumberArray> ReadNumbers(std::span<const std::byte> bytes) {
  const std::string_view text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  if (text.size() >= 6 && text.substr(0, 6) == "\x93NUMPY") {
    HostTensor t;
    STOKER_RETURN_IF_ERROR(codec::DecodeNpyTensor(bytes, &t));
    codec::NumberArray out;
    for (auto d : t.shape) out.shape.push_back(static_cast<std::size_t>(d));
    const std::size_t n = ElementSize(t.type) == 0 ? 0 : t.data.size() / ElementSize(t.type);
    out.values.resize(n);
    auto read = [&](auto sample) {
      using T = decltype(sample);
      for (std::size_t i = 0; i < n; ++i) {
        T v;
        std::memcpy(&v, t.data.data() + i * sizeof(T), sizeof(T));
        out.values[i] = static_cast<double>(v);
      }
    };
    switch (t.type) {
      case ElementType::kUInt8:
        read(std::uint8_t{});
        break;
      case ElementType::kInt8:
        read(std::int8_t{});
        break;
      case ElementType::kInt16:
        read(std::int16_t{});
        break;
      case ElementType::kUInt16:
        read(std::uint16_t{});
        break;
      case ElementType::kInt32:
        read(std::int32_t{});
        break;
      case ElementType::kUInt32:
        read(std::uint32_t{});
        break;
      case ElementType::kInt64:
        read(std::int64_t{});
        break;
      case ElementType::kUInt64:
        read(std::uint64_t{});
        break;
      case ElementType::kFloat32:
        read(float{});
        break;
      case ElementType::kFloat64:
        read(double{});
        break;
      default:
        return Status::Corruption(fmt::format("a {} array holds no coordinates", ElementTypeName(t.type)));
    }
    for (double v : out.values)
      if (!std::isfinite(v)) return Status::Corruption("a coordinate is NaN or infinite");
    return out;
  }
  return codec::ParseNumberArray(text);
}

void ToFloatTensor(const std::vector<double>& values, std::vector<std::int64_t> shape, FieldValue* out) {
  out->tensor.type = ElementType::kFloat32;
  out->tensor.shape = std::move(shape);
  out->tensor.data.resize(values.size() * sizeof(float));
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto f = static_cast<float>(values[i]);
    std::memcpy(out->tensor.data.data() + i * sizeof(float), &f, sizeof(float));
  }
}

float* Floats(FieldValue& v) {
  return reinterpret_cast<float*>(v.tensor.data.data());
}

}  // namespace

Status DecodeBoxesField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions&,
                        FieldValue* out) {
  STOKER_ASSIGN_OR_RETURN(codec::NumberArray a, ReadNumbers(bytes));
  if (a.shape == std::vector<std::size_t>{0}) a.shape = {0, 4};  // [] : no boxes
  if (a.shape.size() != 2 || a.shape[1] != 4)
    return Status::Corruption(fmt::format("boxes must be N x 4 numbers, not shape [{}]", fmt::join(a.shape, ", ")));
  for (std::size_t i = 0; i < a.shape[0]; ++i) {
    const double* b = &a.values[i * 4];
    const bool sized = spec.box_format == "xyxy" ? (b[2] >= b[0] && b[3] >= b[1]) : (b[2] >= 0 && b[3] >= 0);
    if (!sized)
      return Status::Corruption(
          fmt::format("box {} ({}, {}, {}, {}) has a negative size ({})", i, b[0], b[1], b[2], b[3], spec.box_format));
  }
  ToFloatTensor(a.values, {static_cast<std::int64_t>(a.shape[0]), 4}, out);
  return Status::Ok();
}

Status DecodeKeypointsField(std::span<const std::byte> bytes, const FieldSpec&, const FieldDecodeOptions&,
                            FieldValue* out) {
  STOKER_ASSIGN_OR_RETURN(codec::NumberArray a, ReadNumbers(bytes));
  if (a.shape == std::vector<std::size_t>{0}) a.shape = {0, 2};
  const bool ok =
      (a.shape.size() == 2 && a.shape[1] == 2) || (a.shape.size() == 3 && (a.shape[2] == 2 || a.shape[2] == 3));
  if (!ok)
    return Status::Corruption(fmt::format("keypoints must be N x 2, N x K x 2 or N x K x 3 numbers, not shape [{}]",
                                          fmt::join(a.shape, ", ")));
  std::vector<std::int64_t> shape(a.shape.begin(), a.shape.end());
  ToFloatTensor(a.values, std::move(shape), out);
  return Status::Ok();
}

Status DecodeMaskField(std::span<const std::byte> bytes, const FieldSpec& spec, const FieldDecodeOptions& options,
                       FieldValue* out) {
  thread_local codec::SourceImage source;
  thread_local codec::Pixels pixels;
  const auto mode = MaskColorMode(spec.mask_mode);
  if (!mode) return codec::UnknownColorMode(spec.mask_mode);  // CheckFieldSpec refused it already
  STOKER_RETURN_IF_ERROR(codec::DecodeImageTensor(bytes, *mode, options.max_pixels, &source, &pixels, &out->tensor));
  if (out->tensor.shape.size() == 3 && out->tensor.shape[2] == 1) out->tensor.shape.pop_back();  // [H, W, 1] -> [H, W]
  return Status::Ok();
}

std::optional<codec::ColorMode> MaskColorMode(std::string_view mode) {
  const auto parsed = codec::ParseColorMode(mode);
  if (parsed == codec::ColorMode::kL || parsed == codec::ColorMode::kI16 || parsed == codec::ColorMode::kRGB)
    return parsed;
  return std::nullopt;
}

ElementType MaskElementType(codec::ColorMode mode) {
  return mode == codec::ColorMode::kI16 ? ElementType::kUInt16 : ElementType::kUInt8;
}

Result<TargetFollower> TargetFollower::Create(const std::vector<FieldSpec>& specs, bool has_transformed_image) {
  TargetFollower t;
  for (std::size_t f = 0; f < specs.size(); ++f) {
    const FieldSpec& spec = specs[f];
    const bool target = spec.kind == FieldKind::kBoxes || spec.kind == FieldKind::kKeypoints ||
                        spec.kind == FieldKind::kMask || spec.kind == FieldKind::kArray;
    if (spec.kind == FieldKind::kBoxes && spec.box_format != "xyxy" && spec.box_format != "xywh" &&
        spec.box_format != "cxcywh")
      return Status::InvalidArgument(
          fmt::format("field '{}': box format '{}' is not xyxy, xywh or cxcywh", spec.name, spec.box_format));
    if (!spec.labels.empty() && spec.kind != FieldKind::kBoxes)
      return Status::InvalidArgument(fmt::format("field '{}': only boxes have labels", spec.name));
    if (spec.follows && !target)
      return Status::InvalidArgument(
          fmt::format("field '{}': only boxes, keypoints, masks and arrays follow the image", spec.name));
    if (spec.kind == FieldKind::kMask) {
      const auto mode = MaskColorMode(spec.mask_mode);
      if (!mode)
        return Status::InvalidArgument(fmt::format("field '{}': a mask's mode is \"L\", \"I;16\" or \"RGB\", not '{}'",
                                                   spec.name, spec.mask_mode));
      if (auto fill = transform::FillBytes(MaskElementType(*mode), spec.fill); !fill.ok())
        return fill.status().WithContext(fmt::format("field '{}' (mode {})", spec.name, spec.mask_mode));
    }
    if (!spec.follows) continue;
    if (spec.kind == FieldKind::kArray && !spec.array_transform.empty())
      return Status::InvalidArgument(
          fmt::format("field '{}': an Array that follows the image takes the image's steps, not a transform of its own",
                      spec.name));
    if (spec.kind == FieldKind::kArray && !transform::KnownArrayLayout(spec.array_layout))
      return Status::InvalidArgument(
          fmt::format("field '{}': layout is \"HWC\" or \"CHW\", not '{}'", spec.name, spec.array_layout));
    if (!has_transformed_image)
      return Status::InvalidArgument(fmt::format(
          "field '{}' follows the image, but no image field is transformed (give an Image a transform)", spec.name));
    Follower follower{f,
                      spec.kind,
                      spec.name,
                      spec.box_format,
                      std::nullopt,
                      spec.fill,
                      spec.kind == FieldKind::kArray ? spec.array_layout : std::string("HWC")};
    if (!spec.labels.empty()) {
      for (std::size_t g = 0; g < specs.size(); ++g)
        if (specs[g].name == spec.labels) follower.labels = g;
      if (!follower.labels || specs[*follower.labels].kind != FieldKind::kArray)
        return Status::InvalidArgument(
            fmt::format("field '{}': labels='{}' must name an Array field of this loader (one label per box)",
                        spec.name, spec.labels));
    }
    t.followers_.push_back(std::move(follower));
  }
  return t;
}

Status TargetFollower::Apply(const transform::SampleGeometry& geometry, std::vector<std::vector<FieldValue>>& columns,
                             std::size_t index, transform::RasterScratch& scratch) const {
  if (!geometry.valid) return Status::Internal("the image's transform recorded no geometry");
  for (const Follower& f : followers_) {
    FieldValue& value = columns[f.field][index];
    if (!value.present) continue;
    auto with_context = [&f](Status s) { return s.WithContext(fmt::format("field '{}'", f.name)); };
    if (f.kind == FieldKind::kMask || f.kind == FieldKind::kArray) {
      STOKER_RETURN_IF_ERROR(with_context(transform::FollowRaster(
          geometry, f.kind == FieldKind::kMask ? "mask" : "array", f.layout, f.fill, value.tensor, scratch)));
      continue;
    }
    const std::size_t n = value.tensor.data.size() / sizeof(float);
    float* v = Floats(value);
    if (f.kind == FieldKind::kKeypoints) {
      const std::size_t stride = value.tensor.shape.back() == 3 ? 3 : 2;
      std::vector<double> xy;
      xy.reserve(n / stride * 2);
      for (std::size_t i = 0; i + 1 < n; i += stride) {
        xy.push_back(v[i]);
        xy.push_back(v[i + 1]);
      }
      transform::FollowPoints(geometry, xy);
      for (std::size_t i = 0, k = 0; i + 1 < n; i += stride, k += 2) {
        v[i] = static_cast<float>(xy[k]);
        v[i + 1] = static_cast<float>(xy[k + 1]);
      }
      continue;
    }
    // Boxes: to xyxy, moved, dropped without area (with their labels), back to their format.
    const std::size_t boxes = n / 4;
    for (std::size_t i = 0; i < boxes; ++i) {
      float* b = v + i * 4;
      if (f.format == "xywh") {
        b[2] += b[0];
        b[3] += b[1];
      } else if (f.format == "cxcywh") {
        const float cx = b[0], cy = b[1], w = b[2], h = b[3];
        b[0] = cx - w / 2, b[1] = cy - h / 2, b[2] = cx + w / 2, b[3] = cy + h / 2;
      }
    }
    const std::vector<bool> keep = transform::FollowBoxes(geometry, {v, boxes * 4});
    std::size_t kept = 0;
    for (std::size_t i = 0; i < boxes; ++i) {
      if (!keep[i]) continue;
      std::memmove(v + kept * 4, v + i * 4, 4 * sizeof(float));
      float* b = v + kept * 4;
      if (f.format == "xywh") {
        b[2] -= b[0];
        b[3] -= b[1];
      } else if (f.format == "cxcywh") {
        const float x1 = b[0], y1 = b[1], x2 = b[2], y2 = b[3];
        b[0] = (x1 + x2) / 2, b[1] = (y1 + y2) / 2, b[2] = x2 - x1, b[3] = y2 - y1;
      }
      ++kept;
    }
    value.tensor.data.resize(kept * 4 * sizeof(float));
    value.tensor.shape = {static_cast<std::int64_t>(kept), 4};
    if (f.labels) {
      FieldValue& labels = columns[*f.labels][index];
      if (!labels.present || labels.tensor.shape.empty() || labels.tensor.shape[0] != static_cast<std::int64_t>(boxes))
        return with_context(Status::Corruption(
            fmt::format("its labels hold {} entries for {} boxes",
                        labels.present && !labels.tensor.shape.empty() ? labels.tensor.shape[0] : 0, boxes)));
      const std::size_t row = boxes == 0 ? 0 : labels.tensor.data.size() / boxes;
      std::size_t at = 0;
      for (std::size_t i = 0; i < boxes; ++i) {
        if (!keep[i]) continue;
        std::memmove(labels.tensor.data.data() + at * row, labels.tensor.data.data() + i * row, row);
        ++at;
      }
      labels.tensor.data.resize(at * row);
      labels.tensor.shape[0] = static_cast<std::int64_t>(at);
    }
  }
  return Status::Ok();
}

}  // namespace stoker::pipeline
