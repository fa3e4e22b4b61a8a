// The safetensors format, exactly to its specification:
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   a JSON object: {"__metadata__": {str: str}, name: {"dtype": "F32",
//             "shape": [..], "data_offsets": [begin, end]}, ...}, starting with
//             '{' and padded with spaces (stoker pads to a multiple of 8)
//   rest      the data buffer; offsets are relative to it, and the tensors
//             cover it exactly: contiguous, no holes, no overlaps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/checkpoint.h"
#include "stoker/status.h"

namespace stoker::safetensors {

// The format's limit on N.
inline constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

struct TensorLayout {
  std::string name;
  TensorDType dtype = TensorDType::kFloat32;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0;  // in the data buffer
  std::uint64_t end = 0;
};

// product(shape) x element size; InvalidArgument on overflow.
[[nodiscard]] Result<std::uint64_t> TensorBytes(TensorDType dtype, std::span<const std::uint64_t> shape);

// The 8-byte length and the padded JSON header for `tensors`, whose offsets
// must already tile the data buffer. Names and metadata must be valid UTF-8.
[[nodiscard]] Result<std::string> EncodeHeader(std::span<const TensorLayout> tensors,
                                               const std::map<std::string, std::string>& metadata);

struct ParsedFile {
  std::vector<TensorLayout> tensors;  // sorted by offset
  std::map<std::string, std::string> metadata;
  std::uint64_t data_offset = 0;  // 8 + N: where the data buffer starts in the file
};

// What reading headers cost, in operations rather than seconds, so that a
// test can check the work is linear in the number of tensors.
struct ParseWork {
  std::uint64_t json_bytes = 0;    // bytes of JSON text handed to a parser
  std::uint64_t name_lookups = 0;  // look-ups of a key among those already read
};

// Validates every rule on a whole file in memory in one pass over its
// header; errors name `file_name`. `work`, when given, is added to.
[[nodiscard]] Result<ParsedFile> Parse(std::span<const std::byte> file, std::string_view file_name,
                                       ParseWork* work = nullptr);

}  // namespace stoker::safetensors
