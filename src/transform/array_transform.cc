#include "transform/array_transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "transform/array_geometry.h"
#include "transform/array_resize.h"
#include "transform/step.h"

namespace stoker::transform {
namespace {

const std::vector<double>* StepArg(const TransformStep& step, std::string_view name) {
  for (const auto& [key, values] : step.args)
    if (key == name) return &values;
  return nullptr;
}

Status BadArrayStep(const TransformStep& step, std::string_view what) {
  return Status::InvalidArgument(fmt::format("an Array's transform: {}: {}", step.name, what));
}

// The step's (height, width) from `size`: 1 or 2 positive integers.
Result<std::pair<std::int64_t, std::int64_t>> CropSize(const TransformStep& step) {
  const auto* size = StepArg(step, "size");
  if (size == nullptr || size->empty() || size->size() > 2) return BadArrayStep(step, "size takes 1 or 2 numbers");
  for (double v : *size)
    if (!(v >= 1 && v <= 1e9) || v != std::floor(v))
      return BadArrayStep(step, fmt::format("size {} is no positive integer", v));
  return std::pair{static_cast<std::int64_t>(size->front()), static_cast<std::int64_t>(size->back())};
}

// Resize's interpolation: true for bilinear (the default), false for nearest.
Result<bool> ResizeInterpolation(const TransformStep& step) {
  for (const auto& [word, value] : step.words)
    if (word == "interpolation") {
      if (value == "bilinear") return true;
      if (value == "nearest") return false;
      return BadArrayStep(step, fmt::format("interpolation '{}' is not taken (nearest or bilinear)", value));
    }
  return true;
}

double FlipProbability(const TransformStep& step) {
  const auto* p = StepArg(step, "p");
  return p == nullptr || p->empty() ? 0.5 : p->front();
}

void CropArray(HostTensor& t, ArrayGeometry& g, std::int64_t top, std::int64_t left, std::int64_t height,
               std::int64_t width, std::vector<std::byte>& scratch) {
  ArrayGeometry out = g;
  out.height = height;
  out.width = width;
  scratch.resize(out.row_bytes() * static_cast<std::size_t>(out.rows()));
  const std::int64_t planes = g.planes();
  std::byte* to = scratch.data();
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t r = 0; r < height; ++r) {
      const std::int64_t row = p * g.height + top + r;
      std::memcpy(to, t.data.data() + static_cast<std::size_t>(row) * g.row_bytes() + left * g.run(), out.row_bytes());
      to += out.row_bytes();
    }
  t.data.swap(scratch);
  g = out;
  SetArrayShape(t, g);
}

void FlipArrayHorizontally(HostTensor& t, const ArrayGeometry& g, std::vector<std::byte>& scratch) {
  scratch.resize(t.data.size());
  const std::size_t run = g.run(), row = g.row_bytes();
  for (std::int64_t r = 0; r < g.rows(); ++r) {
    const std::byte* from = t.data.data() + static_cast<std::size_t>(r) * row;
    std::byte* to = scratch.data() + static_cast<std::size_t>(r) * row;
    for (std::int64_t x = 0; x < g.width; ++x)
      std::memcpy(to + static_cast<std::size_t>(x) * run, from + static_cast<std::size_t>(g.width - 1 - x) * run, run);
  }
  t.data.swap(scratch);
}

void FlipArrayVertically(HostTensor& t, const ArrayGeometry& g, std::vector<std::byte>& scratch) {
  scratch.resize(t.data.size());
  const std::size_t row = g.row_bytes();
  const std::int64_t planes = g.planes();
  for (std::int64_t p = 0; p < planes; ++p)
    for (std::int64_t r = 0; r < g.height; ++r)
      std::memcpy(scratch.data() + static_cast<std::size_t>(p * g.height + r) * row,
                  t.data.data() + static_cast<std::size_t>(p * g.height + g.height - 1 - r) * row, row);
  t.data.swap(scratch);
}

// A float16's value (IEEE binary16 bits).
float HalfToFloat(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  const float sign = (h & 0x8000) != 0 ? -1.0f : 1.0f;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa != 0 ? std::nanf("") : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
}

template <typename T>
void ConvertToFloat(const std::byte* data, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, data + i * sizeof(T), sizeof(T));
    out[i] = static_cast<float>(v);
  }
}

// The `n` elements of `data` as float32, as torch's .float() makes them.
void ElementsAsFloat(ElementType type, const std::byte* data, std::size_t n, float* out) {
  switch (type) {
    case ElementType::kBool:
    case ElementType::kUInt8:
      return ConvertToFloat<std::uint8_t>(data, n, out);
    case ElementType::kInt8:
      return ConvertToFloat<std::int8_t>(data, n, out);
    case ElementType::kInt16:
      return ConvertToFloat<std::int16_t>(data, n, out);
    case ElementType::kUInt16:
      return ConvertToFloat<std::uint16_t>(data, n, out);
    case ElementType::kInt32:
      return ConvertToFloat<std::int32_t>(data, n, out);
    case ElementType::kUInt32:
      return ConvertToFloat<std::uint32_t>(data, n, out);
    case ElementType::kInt64:
      return ConvertToFloat<std::int64_t>(data, n, out);
    case ElementType::kUInt64:
      return ConvertToFloat<std::uint64_t>(data, n, out);
    case ElementType::kFloat16:
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, data + i * 2, 2);
        out[i] = HalfToFloat(h);
      }
      return;
    case ElementType::kFloat32:
      return ConvertToFloat<float>(data, n, out);
    case ElementType::kFloat64:
      return ConvertToFloat<double>(data, n, out);
  }
}

// (x - mean) / std a band in float32, as torchvision's Normalize computes
// it on a float32 tensor (mean and std made float32 first).
Status NormalizeArray(const TransformStep& step, HostTensor& t, ArrayGeometry& g, std::vector<std::byte>& scratch) {
  const auto& mean = *StepArg(step, "mean");
  const auto& std_dev = *StepArg(step, "std");
  for (const auto* values : {&mean, &std_dev})
    if (values->size() != 1 && static_cast<std::int64_t>(values->size()) != g.bands)
      return Status::InvalidArgument(
          fmt::format("an Array's transform: Normalize has {} means and {} stds for an array of {} bands", mean.size(),
                      std_dev.size(), g.bands));
  const std::size_t n = t.elements();
  scratch.resize(n * sizeof(float));
  auto* out = reinterpret_cast<float*>(scratch.data());
  ElementsAsFloat(t.type, t.data.data(), n, out);
  const auto band_value = [](const std::vector<double>& values, std::int64_t band) {
    return static_cast<float>(values.size() == 1 ? values[0] : values[static_cast<std::size_t>(band)]);
  };
  if (g.bands_first) {
    const std::size_t plane = static_cast<std::size_t>(g.height * g.width);
    for (std::int64_t b = 0; b < g.bands; ++b) {
      const float m = band_value(mean, b), s = band_value(std_dev, b);
      float* p = out + static_cast<std::size_t>(b) * plane;
      for (std::size_t i = 0; i < plane; ++i) p[i] = (p[i] - m) / s;
    }
  } else {
    // A row's worth of means and stds, so that the loop over a row is plain.
    const std::size_t row = static_cast<std::size_t>(g.width * g.bands);
    std::vector<float> means(row), stds(row);
    for (std::size_t i = 0; i < row; ++i) {
      means[i] = band_value(mean, static_cast<std::int64_t>(i) % g.bands);
      stds[i] = band_value(std_dev, static_cast<std::int64_t>(i) % g.bands);
    }
    for (std::int64_t r = 0; r < g.height; ++r) {
      float* p = out + static_cast<std::size_t>(r) * row;
      for (std::size_t i = 0; i < row; ++i) p[i] = (p[i] - means[i]) / stds[i];
    }
  }
  t.data.swap(scratch);
  t.type = ElementType::kFloat32;
  g.element = sizeof(float);
  return Status::Ok();
}

}  // namespace

bool KnownArrayLayout(std::string_view layout) {
  return layout == "HWC" || layout == "CHW";
}

Status CheckArrayTransform(const std::vector<TransformStep>& steps, std::string_view layout) {
  if (!KnownArrayLayout(layout))
    return Status::InvalidArgument(fmt::format("an Array's layout is \"HWC\" or \"CHW\", not \"{}\"", layout));
  for (const TransformStep& step : steps) {
    const auto allow = [&](std::initializer_list<std::string_view> names) -> Status {
      for (const auto& [key, values] : step.args)
        if (std::find(names.begin(), names.end(), std::string_view(key)) == names.end())
          return BadArrayStep(step, fmt::format("argument '{}' is not taken", key));
      return Status::Ok();
    };
    if (!step.children.empty()) return BadArrayStep(step, "steps of steps are not taken");
    if (step.name == "RandomCrop") {
      STOKER_RETURN_IF_ERROR(allow({"size", "padding", "pad_if_needed", "fill"}));
      const auto* pad_if_needed = StepArg(step, "pad_if_needed");
      if (StepArg(step, "padding") != nullptr || (pad_if_needed != nullptr && pad_if_needed->front() != 0))
        return BadArrayStep(step, "padding is not taken for arrays (crop within the array)");
      STOKER_RETURN_IF_ERROR(CropSize(step).status());
    } else if (step.name == "CenterCrop" || step.name == "Resize") {
      STOKER_RETURN_IF_ERROR(allow({"size"}));
      STOKER_RETURN_IF_ERROR(CropSize(step).status());
      if (step.name == "Resize" && !ResizeInterpolation(step).ok()) return ResizeInterpolation(step).status();
    } else if (step.name == "RandomHorizontalFlip" || step.name == "RandomVerticalFlip") {
      STOKER_RETURN_IF_ERROR(allow({"p"}));
      const double p = FlipProbability(step);
      if (!(p >= 0 && p <= 1)) return BadArrayStep(step, fmt::format("p = {} is not in [0, 1]", p));
    } else if (step.name == "Normalize") {
      STOKER_RETURN_IF_ERROR(allow({"mean", "std"}));
      const auto *mean = StepArg(step, "mean"), *std_dev = StepArg(step, "std");
      if (mean == nullptr || std_dev == nullptr || mean->empty() || std_dev->empty())
        return BadArrayStep(step, "mean and std are needed");
      for (double m : *mean)
        if (!std::isfinite(m)) return BadArrayStep(step, fmt::format("mean {} is not finite", m));
      for (double s : *std_dev)
        if (!(std::isfinite(s) && s > 0))
          return BadArrayStep(step, fmt::format("std {} is not positive and finite", s));
    } else {
      return Status::InvalidArgument(
          fmt::format("an Array's transform takes RandomCrop, CenterCrop, Resize, RandomHorizontalFlip, "
                      "RandomVerticalFlip and Normalize, not {}",
                      step.name));
    }
    for (const auto& [word, value] : step.words)
      if (!(word == "padding_mode" && value == "constant") && !(word == "interpolation" && step.name == "Resize"))
        return BadArrayStep(step, fmt::format("'{}' is not taken", word));
  }
  return Status::Ok();
}

Status ApplyArrayTransform(const std::vector<TransformStep>& steps, std::string_view layout, Rng& rng,
                           HostTensor& array, std::vector<std::byte>& scratch) {
  STOKER_ASSIGN_OR_RETURN(ArrayGeometry g, ArrayGeometryOf(array, layout, "an Array's transform takes"));
  for (const TransformStep& step : steps) {
    if (step.name == "RandomCrop" || step.name == "CenterCrop") {
      STOKER_ASSIGN_OR_RETURN(auto size, CropSize(step));
      const auto [height, width] = size;
      if (height > g.height || width > g.width)
        return Status::InvalidArgument(fmt::format("an Array's transform: {} of {}x{} from an array of {}x{} ({})",
                                                   step.name, height, width, g.height, g.width, layout));
      std::int64_t top, left;
      if (step.name == "RandomCrop") {
        top = rng.IntInclusive(0, g.height - height);
        left = rng.IntInclusive(0, g.width - width);
      } else {  // torchvision's CenterCrop: int(round((h - th) / 2)), halves to even
        top = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(g.height - height) / 2.0));
        left = static_cast<std::int64_t>(std::nearbyint(static_cast<double>(g.width - width) / 2.0));
      }
      CropArray(array, g, top, left, height, width, scratch);
    } else if (step.name == "Resize") {
      STOKER_ASSIGN_OR_RETURN(const bool bilinear, ResizeInterpolation(step));
      const auto [height, width] = ArrayResizeSize(*StepArg(step, "size"), g.height, g.width);
      if (height < 1 || width < 1 ||
          static_cast<std::uint64_t>(height) * static_cast<std::uint64_t>(width) > kMaxStepPixels)
        return Status::InvalidArgument(
            fmt::format("an Array's transform: Resize of an array of {}x{} ({}) to {}x{} (at most {} pixels)", g.height,
                        g.width, layout, height, width, kMaxStepPixels));
      STOKER_RETURN_IF_ERROR(ResizeArray(array, g, height, width, bilinear, scratch));
    } else if (step.name == "RandomHorizontalFlip") {
      if (rng.Uniform01() < FlipProbability(step)) FlipArrayHorizontally(array, g, scratch);
    } else if (step.name == "RandomVerticalFlip") {
      if (rng.Uniform01() < FlipProbability(step)) FlipArrayVertically(array, g, scratch);
    } else if (step.name == "Normalize") {
      STOKER_RETURN_IF_ERROR(NormalizeArray(step, array, g, scratch));
    }
  }
  return Status::Ok();
}

}  // namespace stoker::transform
