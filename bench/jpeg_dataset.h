// The JPEG benchmarks' input: a dataset and its JPEG field.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "stoker/dataset.h"

namespace stoker_bench {

struct JpegDataset {
  std::unique_ptr<stoker::Dataset> dataset;
  std::size_t field = 0;  // `jpg`, else `jpeg`
};

// Opens `path` and finds its JPEG field; prints why and gives nothing when
// either fails.
inline std::optional<JpegDataset> OpenJpegDataset(const std::string& path) {
  auto dataset = stoker::Dataset::Open(path);
  if (!dataset.ok()) {
    fmt::print(stderr, "{}\n", dataset.error().ToString());
    return std::nullopt;
  }
  auto field = (*dataset)->FieldIndex("jpg");
  if (!field) field = (*dataset)->FieldIndex("jpeg");
  if (!field) {
    fmt::print(stderr, "{}: no jpg/jpeg field\n", path);
    return std::nullopt;
  }
  return JpegDataset{std::move(*dataset), *field};
}

}  // namespace stoker_bench
