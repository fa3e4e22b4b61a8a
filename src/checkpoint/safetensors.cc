#include "checkpoint/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace stoker {
namespace {

struct DTypeEntry {
  TensorDType dtype;
  std::string_view name;
  std::size_t size;
};

constexpr std::array kDTypes = {
    DTypeEntry{TensorDType::kBool, "BOOL", 1},
    DTypeEntry{TensorDType::kUInt8, "U8", 1},
    DTypeEntry{TensorDType::kInt8, "I8", 1},
    DTypeEntry{TensorDType::kInt16, "I16", 2},
    DTypeEntry{TensorDType::kUInt16, "U16", 2},
    DTypeEntry{TensorDType::kInt32, "I32", 4},
    DTypeEntry{TensorDType::kUInt32, "U32", 4},
    DTypeEntry{TensorDType::kInt64, "I64", 8},
    DTypeEntry{TensorDType::kUInt64, "U64", 8},
    DTypeEntry{TensorDType::kFloat16, "F16", 2},
    DTypeEntry{TensorDType::kBFloat16, "BF16", 2},
    DTypeEntry{TensorDType::kFloat32, "F32", 4},
    DTypeEntry{TensorDType::kFloat64, "F64", 8},
    DTypeEntry{TensorDType::kComplex64, "C64", 8},
    DTypeEntry{TensorDType::kFloat8E4M3, "F8_E4M3", 1},
    DTypeEntry{TensorDType::kFloat8E4M3Fnuz, "F8_E4M3FNUZ", 1},
    DTypeEntry{TensorDType::kFloat8E5M2, "F8_E5M2", 1},
    DTypeEntry{TensorDType::kFloat8E5M2Fnuz, "F8_E5M2FNUZ", 1},
    DTypeEntry{TensorDType::kFloat8E8M0, "F8_E8M0", 1},
};

// kDTypes lists the enumerators in order, so a dtype is its own index.
constexpr bool InEnumOrder() {
  for (std::size_t i = 0; i < kDTypes.size(); ++i)
    if (static_cast<std::size_t>(kDTypes[i].dtype) != i) return false;
  return true;
}
static_assert(InEnumOrder());

const DTypeEntry& Entry(TensorDType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  return i < kDTypes.size() ? kDTypes[i] : kDTypes[0];  // the fallback is unreachable for valid enumerators
}

}  // namespace

std::string_view TensorDTypeName(TensorDType dtype) {
  return Entry(dtype).name;
}
std::size_t TensorDTypeSize(TensorDType dtype) {
  return Entry(dtype).size;
}
std::optional<TensorDType> ParseTensorDType(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

namespace safetensors {
namespace {

using Json = nlohmann::json;

Result<std::string> DumpJson(const Json& value) {
  try {
    return value.dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::exception& e) {
    return Status::InvalidArgument(fmt::format("cannot encode safetensors header: {}", e.what()));
  }
}

}  // namespace

Result<std::uint64_t> TensorBytes(TensorDType dtype, std::span<const std::uint64_t> shape) {
  std::uint64_t bytes = TensorDTypeSize(dtype);
  for (std::uint64_t dim : shape) {
    if (dim != 0 && bytes > UINT64_MAX / dim) return Status::InvalidArgument("tensor size overflows 64 bits");
    bytes *= dim;
  }
  return bytes;
}

Result<std::string> EncodeHeader(std::span<const TensorLayout> tensors,
                                 const std::map<std::string, std::string>& metadata) {
  // Written by hand rather than through a JSON object so that the order is
  // ours: __metadata__ first, then the tensors in data order.
  std::string json = "{";
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    STOKER_ASSIGN_OR_RETURN(std::string text, DumpJson(meta));
    json += "\"__metadata__\":" + text;
  }
  for (const auto& t : tensors) {
    if (t.name == "__metadata__") return Status::InvalidArgument("a tensor may not be named '__metadata__'");
    if (json.size() > 1) json += ',';
    STOKER_ASSIGN_OR_RETURN(std::string name, DumpJson(Json(t.name)));
    json += fmt::format("{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", name,
                        TensorDTypeName(t.dtype), fmt::join(t.shape, ","), t.begin, t.end);
  }
  json += '}';
  json.append((8 - json.size() % 8) % 8, ' ');
  if (json.size() > kMaxHeaderBytes)
    return Status::InvalidArgument(
        fmt::format("safetensors header of {} bytes exceeds the format's limit of {} bytes ({} tensors)", json.size(),
                    kMaxHeaderBytes, tensors.size()));
  std::string out(8, '\0');
  const std::uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json;
}

}  // namespace safetensors
}  // namespace stoker
