// The sample keys a writer has taken, so that a key given twice is refused,
// without a copy of every key in memory: a 64-bit hash of each maps to the
// first sample with it, and on a hit the key is read back from where the
// writer keeps it (its index builder) and compared. A key whose hash an
// earlier, different key already holds (a few in a million at 10 M keys)
// is kept whole beside the map, so no repeat goes unnoticed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace stoker::pack_internal {

class TakenKeys {
 public:
  using Hash = std::uint64_t (*)(std::string_view key);
  // The writer's key of a sample it holds.
  using KeyOf = std::function<std::string_view(std::uint64_t sample)>;

  // `hash`: XXH3-64 by default; tests give a poor one to make keys collide.
  explicit TakenKeys(Hash hash = nullptr);

  // The sample that took `key`, if one did.
  [[nodiscard]] std::optional<std::uint64_t> Find(std::string_view key, const KeyOf& key_of) const;
  // Records `key` as taken by `sample`; the caller Finds it first.
  void Add(std::string_view key, std::uint64_t sample);

  [[nodiscard]] std::size_t collided() const { return collided_.size(); }

 private:
  Hash hash_;
  std::unordered_map<std::uint64_t, std::uint64_t> first_by_hash_;
  std::unordered_map<std::string, std::uint64_t> collided_;
};

}  // namespace stoker::pack_internal
