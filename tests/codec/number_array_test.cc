#include "codec/number_array.h"

#include <gtest/gtest.h>

namespace stoker::codec {
namespace {

TEST(NumberArray, ShapesOfNestedLists) {
  auto boxes = ParseNumberArray(" [[10, 20.5, 30, 40], [1, 2, 3, 4e1]] ");
  ASSERT_TRUE(boxes.ok());
  EXPECT_EQ(boxes->shape, (std::vector<std::size_t>{2, 4}));
  EXPECT_EQ(boxes->values, (std::vector<double>{10, 20.5, 30, 40, 1, 2, 3, 40}));
  auto empty = ParseNumberArray("[]");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->shape, (std::vector<std::size_t>{0}));
  auto lone = ParseNumberArray("-7");
  ASSERT_TRUE(lone.ok());
  EXPECT_TRUE(lone->shape.empty());
  EXPECT_EQ(lone->values, (std::vector<double>{-7}));
  auto deep = ParseNumberArray("[[[1,2,3],[4,5,6]]]");
  ASSERT_TRUE(deep.ok());
  EXPECT_EQ(deep->shape, (std::vector<std::size_t>{1, 2, 3}));
  auto empties = ParseNumberArray("[[], []]");
  ASSERT_TRUE(empties.ok());
  EXPECT_EQ(empties->shape, (std::vector<std::size_t>{2, 0}));
}

TEST(NumberArray, RefusesWhatIsNotARectangleOfNumbers) {
  for (const char* bad : {"[[1, 2], [3]]", "[[1, 2], 3]", "[1, [2]]", "[[1], []]", "{\"boxes\": []}", "[1, 2,]",
                          "[1 2]", "[\"1\"]", "[NaN]", "[1e999]", "[[[[[[[[[1]]]]]]]]]", "", "[1] x", "[1, 2"}) {
    auto parsed = ParseNumberArray(bad);
    EXPECT_FALSE(parsed.ok()) << bad;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.error().code(), StatusCode::kCorruption) << bad;
    }
  }
}

}  // namespace
}  // namespace stoker::codec
