// stoker/tensor.h: a dense array on the host, as decoded fields arrive.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace stoker {

// NumPy's fixed-size element types (what an .npy field may hold).
enum class ElementType : std::uint8_t {
  kBool,
  kInt8,
  kUInt8,
  kInt16,
  kUInt16,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
};
[[nodiscard]] std::size_t ElementSize(ElementType type);
[[nodiscard]] std::string_view ElementTypeName(ElementType type);  // NumPy's: "bool", "int8", ..., "float64"

// C order, host byte order; data.size() == elements() * ElementSize(type).
struct HostTensor {
  ElementType type = ElementType::kUInt8;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
  [[nodiscard]] std::uint64_t elements() const;
};

}  // namespace stoker
