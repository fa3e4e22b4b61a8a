// The Python package keeps a saved state's nested structure in the
// manifest's user JSON as {"structure": NODE}, where a NODE {"t": NAME}
// stands for the tensor NAME (docs/checkpoint.md). Every such name must be a
// tensor of the checkpoint, or loading would fail later without saying where.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <unordered_map>

#include "checkpoint/safetensors.h"
#include "stoker/status.h"

namespace stoker::checkpoint {

// Tensor name -> its index in the loaded checkpoint.
using TensorIndex = std::unordered_map<std::string_view, std::size_t>;

// Reads `user_json` in one streaming pass (no tree: it can be megabytes).
// Corruption naming `where` when it is not valid JSON or its structure names
// a tensor that `tensors` lacks; Ok for a document without a structure.
// `work`, when given, is added to.
[[nodiscard]] Status CheckStructure(std::string_view user_json, const TensorIndex& tensors, const std::string& where,
                                    safetensors::ParseWork* work);

}  // namespace stoker::checkpoint
