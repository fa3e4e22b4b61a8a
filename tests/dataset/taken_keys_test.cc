#include "dataset/taken_keys.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace stoker::pack_internal {
namespace {

std::uint64_t EveryKeyCollides(std::string_view) {
  return 42;
}
std::uint64_t ByFirstLetter(std::string_view key) {
  return key.empty() ? 0 : static_cast<unsigned char>(key[0]);
}

// Keys added in order, as a writer's samples 0, 1, 2...; every one found
// again as its own sample, and keys never added not found.
void ExpectExact(TakenKeys& taken, const std::vector<std::string>& keys, const std::vector<std::string>& absent) {
  const auto key_of = [&](std::uint64_t sample) -> std::string_view { return keys.at(sample); };
  for (std::uint64_t i = 0; i < keys.size(); ++i) {
    ASSERT_FALSE(taken.Find(keys[i], key_of).has_value()) << keys[i] << " before it was added";
    taken.Add(keys[i], i);
  }
  for (std::uint64_t i = 0; i < keys.size(); ++i) {
    const auto found = taken.Find(keys[i], key_of);
    ASSERT_TRUE(found.has_value()) << keys[i];
    EXPECT_EQ(*found, i) << keys[i];
  }
  for (const std::string& key : absent) EXPECT_FALSE(taken.Find(key, key_of).has_value()) << key;
}

TEST(TakenKeys, AKeyGivenAgainIsFoundWhateverItsHashShares) {
  const std::vector<std::string> keys = {"cat/001", "cat/002", "dog/001", "dog/002", "eel/1", "c"};
  const std::vector<std::string> absent = {"cat/003", "d", "", "eel/10"};
  TakenKeys usual;
  ExpectExact(usual, keys, absent);
  EXPECT_EQ(usual.collided(), 0u);
  // Keys sharing a hash with an earlier key are kept whole: with a hash
  // that maps every key alike, or keys to a few buckets.
  TakenKeys all_collide(&EveryKeyCollides);
  ExpectExact(all_collide, keys, absent);
  EXPECT_EQ(all_collide.collided(), keys.size() - 1);
  TakenKeys some_collide(&ByFirstLetter);
  ExpectExact(some_collide, keys, absent);
  EXPECT_EQ(some_collide.collided(), 3u);  // cat/002, dog/002, c
}

}  // namespace
}  // namespace stoker::pack_internal
