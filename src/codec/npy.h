// NumPy's .npy format (versions 1.0, 2.0 and 3.0): the header parsed
// without Python, the data checked against it and brought to C order and
// host byte order. Object arrays are refused (loading them runs pickle).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::codec {

struct NpyArray {
  ElementType type = ElementType::kUInt8;
  std::vector<std::int64_t> shape;
  bool fortran_order = false;
  bool byte_swapped = false;        // stored in the other byte order than this machine's
  std::span<const std::byte> data;  // the raw elements, inside the bytes given to ParseNpy
  [[nodiscard]] std::uint64_t elements() const;
};

// Parses and checks `npy`: the magic, the header's dictionary ('descr',
// 'fortran_order', 'shape', nothing else), a supported dtype, and that the
// data is exactly as long as the shape says. Corruption naming what is
// wrong; Unimplemented for a dtype stoker does not load (object, structured,
// complex, strings, datetimes), saying which.
[[nodiscard]] Result<NpyArray> ParseNpy(std::span<const std::byte> npy);

// Writes `array`'s elements to `out` (elements() * ElementSize bytes) in C
// order and host byte order.
void CopyNpyData(const NpyArray& array, std::byte* out);

// ParseNpy then CopyNpyData into `out`.
[[nodiscard]] Status DecodeNpyTensor(std::span<const std::byte> npy, HostTensor* out);

}  // namespace stoker::codec
