#include "transform/follow_raster.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/half.h"
#include "transform/array_geometry.h"

namespace stoker::transform {
namespace {

template <typename T>
std::vector<std::byte> BytesOf(T value) {
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &value, sizeof(T));
  return out;
}

// An integer type's fill: whole and within [min, max] (compared as doubles,
// exact at the bounds of every type up to 64 bits: 2^63 and 2^64 are).
template <typename T>
Result<std::vector<std::byte>> IntegerFill(double fill, ElementType type) {
  const double low = static_cast<double>(std::numeric_limits<T>::min());
  const double above = std::ldexp(1.0, std::numeric_limits<T>::digits);  // max + 1
  if (!(fill == std::floor(fill) && fill >= low && fill < above))
    return Status::InvalidArgument(fmt::format("fill {} is no {} value", fill, ElementTypeName(type)));
  return BytesOf(static_cast<T>(fill));
}

}  // namespace

Result<std::vector<std::byte>> FillBytes(ElementType type, double fill) {
  switch (type) {
    case ElementType::kBool:
      if (fill != 0 && fill != 1) return Status::InvalidArgument(fmt::format("fill {} is no bool value", fill));
      return BytesOf(static_cast<std::uint8_t>(fill));
    case ElementType::kInt8:
      return IntegerFill<std::int8_t>(fill, type);
    case ElementType::kUInt8:
      return IntegerFill<std::uint8_t>(fill, type);
    case ElementType::kInt16:
      return IntegerFill<std::int16_t>(fill, type);
    case ElementType::kUInt16:
      return IntegerFill<std::uint16_t>(fill, type);
    case ElementType::kInt32:
      return IntegerFill<std::int32_t>(fill, type);
    case ElementType::kUInt32:
      return IntegerFill<std::uint32_t>(fill, type);
    case ElementType::kInt64:
      return IntegerFill<std::int64_t>(fill, type);
    case ElementType::kUInt64:
      return IntegerFill<std::uint64_t>(fill, type);
    case ElementType::kFloat16:
      return BytesOf(FloatToHalfBits(static_cast<float>(fill)));
    case ElementType::kFloat32:
      return BytesOf(static_cast<float>(fill));
    case ElementType::kFloat64:
      return BytesOf(fill);
  }
  return Status::InvalidArgument("fill for an unknown element type");
}

Status FollowRaster(const SampleGeometry& g, std::string_view what, std::string_view layout, double fill,
                    HostTensor& raster, RasterScratch& scratch) {
  if (raster.shape.size() != 2 && raster.shape.size() != 3)
    return Status::Corruption(
        fmt::format("an {} that follows the image is [H, W], [H, W, C] or (layout \"CHW\") "
                    "[C, H, W], not shape [{}]",
                    what, fmt::join(raster.shape, ", ")));
  STOKER_ASSIGN_OR_RETURN(ArrayGeometry a, ArrayGeometryOf(raster, layout, "a raster following the image is"));
  if (a.height != g.source.height || a.width != g.source.width)
    return Status::Corruption(fmt::format("the {} is {}x{}, its image {}x{}: a {} follows an image of its size", what,
                                          a.width, a.height, g.source.width, g.source.height, what));
  if (a.run() > static_cast<std::size_t>(std::numeric_limits<int>::max() / 2))
    return Status::Corruption(fmt::format("the {}'s pixels are {} bytes each, too many to move", what, a.run()));
  STOKER_ASSIGN_OR_RETURN(const std::vector<std::byte> fill_bytes, FillBytes(raster.type, fill));
  // The warps fill every byte of a pixel of up to 3 bytes with one value,
  // and larger pixels with zeros: any other fill goes in afterwards, where
  // a plane of ones moved the same way came out 0.
  const bool zero_fill = std::ranges::all_of(fill_bytes, [](std::byte b) { return b == std::byte{0}; });
  const bool byte_fill = a.element == 1 && a.run() <= 3;
  const auto warp_fill = byte_fill ? static_cast<std::uint8_t>(fill_bytes[0]) : std::uint8_t{0};

  const auto channels = static_cast<int>(a.run());
  const std::size_t plane_bytes = a.row_bytes() * static_cast<std::size_t>(a.height);
  Size out{};
  std::size_t out_plane_bytes = 0;
  for (std::int64_t p = 0; p < a.planes(); ++p) {
    Image& plane = scratch.plane;
    plane.width = static_cast<int>(a.width);
    plane.height = static_cast<int>(a.height);
    plane.channels = channels;
    // assign, not Reset + copy: resizing would zero the buffer first.
    const auto* from =
        reinterpret_cast<const std::uint8_t*>(raster.data.data()) + static_cast<std::size_t>(p) * plane_bytes;
    plane.pixels.assign(from, from + plane_bytes);
    STOKER_RETURN_IF_ERROR(FollowMask(g, plane, scratch.scratch, warp_fill));
    if (p == 0) {
      out = plane.size();
      out_plane_bytes = plane.pixels.size();
      scratch.moved.resize(out_plane_bytes * static_cast<std::size_t>(a.planes()));
    }
    std::memcpy(scratch.moved.data() + static_cast<std::size_t>(p) * out_plane_bytes, plane.pixels.data(),
                out_plane_bytes);
  }
  if (!zero_fill && !byte_fill) {
    Image& coverage = scratch.coverage;
    coverage.width = static_cast<int>(a.width);
    coverage.height = static_cast<int>(a.height);
    coverage.channels = 1;
    coverage.pixels.assign(static_cast<std::size_t>(a.width * a.height), std::uint8_t{1});
    STOKER_RETURN_IF_ERROR(FollowMask(g, coverage, scratch.scratch, 0));
    const std::size_t per_pixel = a.run() / a.element;  // elements of a pixel in one plane
    for (std::size_t i = 0; i < coverage.pixels.size(); ++i) {
      if (coverage.pixels[i] != 0) continue;
      for (std::int64_t p = 0; p < a.planes(); ++p) {
        std::byte* pixel = scratch.moved.data() + static_cast<std::size_t>(p) * out_plane_bytes + i * a.run();
        for (std::size_t e = 0; e < per_pixel; ++e) std::memcpy(pixel + e * a.element, fill_bytes.data(), a.element);
      }
    }
  }
  // Copied, not swapped: the raster keeps a buffer of its own size. A
  // decoded array is often several times the crop it follows into, and a
  // batch slot holds its samples' buffers until the batch is delivered.
  if (raster.data.capacity() > 2 * scratch.moved.size()) {
    std::vector<std::byte>(scratch.moved.begin(), scratch.moved.end()).swap(raster.data);
  } else {
    raster.data.assign(scratch.moved.begin(), scratch.moved.end());
  }
  a.height = out.height;
  a.width = out.width;
  SetArrayShape(raster, a);
  return Status::Ok();
}

}  // namespace stoker::transform
