// Where a 2-D or 3-D array's height, width and bands lie ("HWC": [H, W] or
// [H, W, C]; "CHW": [C, H, W]) and how its bytes are laid out: shared by
// the array transforms and the arrays that follow an image.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "stoker/status.h"
#include "stoker/tensor.h"

namespace stoker::transform {

struct ArrayGeometry {
  std::int64_t bands = 1, height = 0, width = 0;
  bool bands_first = false;  // CHW
  std::size_t element = 1;

  // Rows of `width` runs of `run` bytes: HWC is height rows of width
  // pixels of all bands; CHW is bands x height rows of width elements.
  [[nodiscard]] std::int64_t rows() const { return bands_first ? bands * height : height; }
  [[nodiscard]] std::size_t run() const { return bands_first ? element : element * static_cast<std::size_t>(bands); }
  [[nodiscard]] std::size_t row_bytes() const { return run() * static_cast<std::size_t>(width); }
  [[nodiscard]] std::int64_t planes() const { return bands_first ? bands : 1; }
};

// InvalidArgument, beginning with `what` ("an Array's transform takes"),
// for an array that is not 2-D or 3-D.
[[nodiscard]] inline Result<ArrayGeometry> ArrayGeometryOf(const HostTensor& t, std::string_view layout,
                                                           std::string_view what) {
  ArrayGeometry g;
  g.element = ElementSize(t.type);
  g.bands_first = layout == "CHW";
  if (t.shape.size() == 2) {
    g.height = t.shape[0];
    g.width = t.shape[1];
  } else if (t.shape.size() == 3) {
    g.bands = g.bands_first ? t.shape[0] : t.shape[2];
    g.height = g.bands_first ? t.shape[1] : t.shape[0];
    g.width = g.bands_first ? t.shape[2] : t.shape[1];
  } else {
    return Status::InvalidArgument(
        fmt::format("{} 2-D or 3-D arrays ({}), not shape [{}]", what, layout, fmt::join(t.shape, ", ")));
  }
  return g;
}

// The shape of `g`, keeping a 2-D array 2-D.
inline void SetArrayShape(HostTensor& t, const ArrayGeometry& g) {
  if (t.shape.size() == 2) {
    t.shape = {g.height, g.width};
  } else if (g.bands_first) {
    t.shape = {g.bands, g.height, g.width};
  } else {
    t.shape = {g.height, g.width, g.bands};
  }
}

}  // namespace stoker::transform
