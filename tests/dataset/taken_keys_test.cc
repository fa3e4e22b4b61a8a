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
  const TakenKeys::KeyOf key_of = [&](std::uint64_t sample) -> Result<std::string> { return keys.at(sample); };
  for (std::uint64_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(*taken.Find(keys[i], key_of), std::nullopt) << keys[i] << " before it was added";
    taken.Add(keys[i], i);
  }
  for (std::uint64_t i = 0; i < keys.size(); ++i) EXPECT_EQ(*taken.Find(keys[i], key_of), i) << keys[i];
  for (const std::string& key : absent) EXPECT_EQ(*taken.Find(key, key_of), std::nullopt) << key;
}

TEST(TakenKeys, AKeyGivenAgainIsFoundWhateverItsHashShares) {
  const std::vector<std::string> keys = {"cat/001", "cat/002", "dog/001", "dog/002", "eel/1", "c"};
  const std::vector<std::string> absent = {"cat/003", "d", "", "eel/10"};
  TakenKeys usual;
  ExpectExact(usual, keys, absent);
  // Keys sharing a hash each keep a slot: with a hash that maps every key
  // alike, or keys to a few values (and all to one of the 256 tables).
  TakenKeys all_collide(&EveryKeyCollides);
  ExpectExact(all_collide, keys, absent);
  TakenKeys some_collide(&ByFirstLetter);
  ExpectExact(some_collide, keys, absent);
  EXPECT_EQ(some_collide.size(), keys.size());
}

TEST(TakenKeys, ManyKeysAreFoundAtAboutTwentyFiveBytesAKey) {
  std::vector<std::string> keys;
  for (int i = 0; i < 200'000; ++i) keys.push_back("shard" + std::to_string(i % 97) + "/" + std::to_string(i));
  TakenKeys taken;
  const TakenKeys::KeyOf key_of = [&](std::uint64_t sample) -> Result<std::string> { return keys.at(sample); };
  for (std::uint64_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(*taken.Find(keys[i], key_of), std::nullopt) << keys[i];
    taken.Add(keys[i], i);
  }
  for (std::uint64_t i = 0; i < keys.size(); i += 7) EXPECT_EQ(*taken.Find(keys[i], key_of), i) << keys[i];
  EXPECT_EQ(*taken.Find("shard0/200000", key_of), std::nullopt);
  // A key that cannot be read back (a scratch file's read failing) is the error Find gives.
  const TakenKeys::KeyOf failing = [](std::uint64_t) -> Result<std::string> { return Status::IOError("gone"); };
  EXPECT_EQ(taken.Find(keys[5], failing).status().code(), StatusCode::kIOError);
  // 16-byte slots at most 7/8 full, each of the 256 tables at least 7/16
  // full after it doubled: 18 to 37 bytes a key.
  const double per_key = static_cast<double>(taken.table_bytes()) / static_cast<double>(keys.size());
  EXPECT_GE(per_key, 18.0);
  EXPECT_LE(per_key, 37.0);
}

}  // namespace
}  // namespace stoker::pack_internal
