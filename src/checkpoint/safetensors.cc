#include "checkpoint/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <set>

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

const DTypeEntry& Entry(TensorDType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e;
  return kDTypes[0];  // unreachable for valid enumerators
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

std::uint64_t LoadLittleEndian64(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<std::uint8_t>(p[i]);
  return v;
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

Result<ParsedFile> Parse(std::span<const std::byte> file, std::string_view file_name) {
  auto bad = [&](std::string_view what) {
    return Status::Corruption(fmt::format("'{}' is not a valid safetensors file: {}", file_name, what));
  };
  if (file.size() < 8) return bad(fmt::format("{} bytes, shorter than the 8-byte header length", file.size()));
  const std::uint64_t n = LoadLittleEndian64(file.data());
  if (n > kMaxHeaderBytes) return bad(fmt::format("header length {} exceeds the limit of {}", n, kMaxHeaderBytes));
  if (n > file.size() - 8)
    return bad(fmt::format("header length {} runs past the end of the file ({} bytes)", n, file.size()));
  if (n == 0 || file[8] != std::byte{'{'}) return bad("the header does not start with '{'");
  const char* text = reinterpret_cast<const char*>(file.data() + 8);

  // Duplicate keys are an error; nlohmann would keep the last silently.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto on_event = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == Json::parse_event_t::key && !open_objects.empty() && parsed.is_string()) {
      if (!open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header = Json::parse(text, text + n, on_event, /*allow_exceptions=*/false);
  if (header.is_discarded()) return bad("the header is not valid JSON");
  if (!duplicate.empty()) return bad(fmt::format("duplicate key '{}' in the header", duplicate));
  if (!header.is_object()) return bad("the header is not a JSON object");

  ParsedFile parsed;
  parsed.data_offset = 8 + n;
  const std::uint64_t data_size = file.size() - parsed.data_offset;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const Json& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) return bad("__metadata__ is not an object");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) return bad(fmt::format("__metadata__ value of '{}' is not a string", m.key()));
        parsed.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!value.is_object()) return bad(where + " is not an object");
    for (auto f = value.begin(); f != value.end(); ++f)
      if (f.key() != "dtype" && f.key() != "shape" && f.key() != "data_offsets")
        return bad(fmt::format("{} has an unknown field '{}'", where, f.key()));
    if (!value.contains("dtype") || !value["dtype"].is_string()) return bad(where + " has no dtype string");
    TensorLayout t;
    t.name = name;
    const auto dtype = ParseTensorDType(value["dtype"].get<std::string>());
    if (!dtype) return bad(fmt::format("{} has an unsupported dtype '{}'", where, value["dtype"].get<std::string>()));
    t.dtype = *dtype;
    if (!value.contains("shape") || !value["shape"].is_array()) return bad(where + " has no shape array");
    for (const auto& d : value["shape"]) {
      if (!d.is_number_unsigned()) return bad(where + " has a shape entry that is not a non-negative integer");
      t.shape.push_back(d.get<std::uint64_t>());
    }
    const auto& offsets = value.contains("data_offsets") ? value["data_offsets"] : Json();
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned())
      return bad(where + " has no data_offsets pair of non-negative integers");
    t.begin = offsets[0].get<std::uint64_t>();
    t.end = offsets[1].get<std::uint64_t>();
    if (t.begin > t.end)
      return bad(fmt::format("{} has data_offsets [{}, {}] that run backwards", where, t.begin, t.end));
    auto bytes = TensorBytes(t.dtype, t.shape);
    if (!bytes.ok()) return bad(where + ": " + bytes.error().message());
    if (*bytes != t.end - t.begin)
      return bad(fmt::format("{} of dtype {} and shape [{}] needs {} bytes but data_offsets [{}, {}] hold {}", where,
                             TensorDTypeName(t.dtype), fmt::join(t.shape, ", "), *bytes, t.begin, t.end,
                             t.end - t.begin));
    if (t.end > data_size)
      return bad(fmt::format("{} ends at data offset {}, past the data buffer of {} bytes", where, t.end, data_size));
    parsed.tensors.push_back(std::move(t));
  }
  std::sort(parsed.tensors.begin(), parsed.tensors.end(), [](const TensorLayout& a, const TensorLayout& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  for (const auto& t : parsed.tensors) {
    if (t.begin != covered)
      return bad(fmt::format("tensor '{}' starts at data offset {} but the previous tensor ends at {} ({})", t.name,
                             t.begin, covered, t.begin > covered ? "a hole" : "an overlap"));
    covered = t.end;
  }
  if (covered != data_size)
    return bad(fmt::format("the tensors cover {} bytes of a {}-byte data buffer", covered, data_size));
  return parsed;
}

}  // namespace safetensors
}  // namespace stoker
