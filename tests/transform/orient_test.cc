#include "transform/orient.h"

#include <array>
#include <vector>

#include <gtest/gtest.h>

namespace stoker::transform {
namespace {

// A 3x2 image whose pixels are their own ids: (x, y) -> 10*y + x in every channel.
//   0  1  2
//  10 11 12
std::vector<std::uint8_t> Ids() {
  std::vector<std::uint8_t> px;
  for (int y = 0; y < 2; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 3; ++c) px.push_back(static_cast<std::uint8_t>(10 * y + x));
  return px;
}

std::vector<int> Turned(int orientation) {
  const auto src = Ids();
  std::vector<std::uint8_t> out;
  ApplyOrientation({src.data(), 3, 2, 9}, orientation, out);
  std::vector<int> ids;
  for (std::size_t i = 0; i < out.size(); i += 3) ids.push_back(out[i]);
  return ids;
}

TEST(Orientation, MatchesExifTransposeForAllEight) {
  // What Pillow's ImageOps.exif_transpose gives for each tag value, row by row.
  EXPECT_EQ(Turned(1), (std::vector<int>{0, 1, 2, 10, 11, 12}));
  EXPECT_EQ(Turned(2), (std::vector<int>{2, 1, 0, 12, 11, 10}));  // mirrored left-right
  EXPECT_EQ(Turned(3), (std::vector<int>{12, 11, 10, 2, 1, 0}));  // 180 degrees
  EXPECT_EQ(Turned(4), (std::vector<int>{10, 11, 12, 0, 1, 2}));  // mirrored top-bottom
  EXPECT_EQ(Turned(5), (std::vector<int>{0, 10, 1, 11, 2, 12}));  // transposed (2 wide, 3 high)
  EXPECT_EQ(Turned(6), (std::vector<int>{10, 0, 11, 1, 12, 2}));  // 90 degrees clockwise
  EXPECT_EQ(Turned(7), (std::vector<int>{12, 2, 11, 1, 10, 0}));  // transverse
  EXPECT_EQ(Turned(8), (std::vector<int>{2, 12, 1, 11, 0, 10}));  // 90 degrees anticlockwise
  EXPECT_EQ(Turned(0), Turned(1));                                // unknown values leave the image as it is
  EXPECT_EQ(Oriented(3, 2, 6).width, 2);
  EXPECT_EQ(Oriented(3, 2, 3).width, 3);
}

}  // namespace
}  // namespace stoker::transform
