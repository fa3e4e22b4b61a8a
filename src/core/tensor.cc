#include "stoker/tensor.h"

namespace stoker {

std::size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kBool:
    case ElementType::kInt8:
    case ElementType::kUInt8:
      return 1;
    case ElementType::kInt16:
    case ElementType::kUInt16:
    case ElementType::kFloat16:
      return 2;
    case ElementType::kInt32:
    case ElementType::kUInt32:
    case ElementType::kFloat32:
      return 4;
    case ElementType::kInt64:
    case ElementType::kUInt64:
    case ElementType::kFloat64:
      return 8;
  }
  return 0;
}

std::string_view ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kBool:
      return "bool";
    case ElementType::kInt8:
      return "int8";
    case ElementType::kUInt8:
      return "uint8";
    case ElementType::kInt16:
      return "int16";
    case ElementType::kUInt16:
      return "uint16";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kUInt32:
      return "uint32";
    case ElementType::kInt64:
      return "int64";
    case ElementType::kUInt64:
      return "uint64";
    case ElementType::kFloat16:
      return "float16";
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
  }
  return "?";
}

std::uint64_t HostTensor::elements() const {
  std::uint64_t n = 1;
  for (auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

}  // namespace stoker
