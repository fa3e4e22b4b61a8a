// JSON nested lists of numbers ("[[10, 20.5, 30, 40], [1, 2, 3, 4]]"), as
// annotation files hold boxes and keypoints: parsed into the numbers (row
// major) and a rectangular shape. Anything else (objects, strings, ragged
// lists, non-finite numbers, nesting deeper than 8) is Corruption saying
// where.
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

#include "stoker/status.h"

namespace stoker::codec {

struct NumberArray {
  std::vector<double> values;
  std::vector<std::size_t> shape;  // [] for a lone number; [0] for []
};

[[nodiscard]] Result<NumberArray> ParseNumberArray(std::string_view json);

}  // namespace stoker::codec
